"""hold_for_approval: a decision that requires a person.

Until the approvals capability lands, nothing is held: a decision that requires
approval is refused (fail closed) and says why.
"""

from __future__ import annotations

from gateway import errors
from gateway.context import ExecContext
from gateway.errors import GatewayError
from gateway.services import Services


async def hold_for_approval(ctx: ExecContext, svc: Services) -> None:
    decision = ctx.decision
    assert decision is not None
    if not decision.require_approval:
        return
    raise GatewayError(
        errors.POLICY_DENIED,
        "policy requires human approval, and approvals are not enabled on this gateway",
        reasons=[decision.approval_reason or "approval required"],
        decision_id=decision.decision_id,
        require_approval=True,
    )
