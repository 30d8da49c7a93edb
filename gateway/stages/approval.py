"""redeem_approval: a presented approval token, verified and spent.
hold_for_approval: a decision that requires a person holds the request.
"""

from __future__ import annotations

import hashlib

from gateway import errors
from gateway.approval_tokens import ApprovalTokenError
from gateway.approvals import Approval, iso
from gateway.context import ExecContext
from gateway.errors import GatewayError
from gateway.services import Services


class Held(Exception):
    """Not an error: the request waits for a person (202)."""

    def __init__(self, approval: Approval) -> None:
        super().__init__(approval.id)
        self.approval = approval


def _refuse(reason: str, message: str) -> GatewayError:
    return GatewayError(errors.APPROVAL_INVALID, message, reason=reason)


async def redeem_approval(ctx: ExecContext, svc: Services) -> None:
    assert ctx.request is not None and ctx.principal is not None
    token = ctx.request.approval_token
    if not token:
        return
    signer = svc.approvals.signer
    assert signer is not None
    try:
        grant = signer.verify(token)
    except ApprovalTokenError as exc:
        raise _refuse(exc.reason, f"approval token refused: {exc.reason}") from None
    code_sha256 = hashlib.sha256(ctx.request.code.encode("utf-8")).hexdigest()
    if grant.tenant != ctx.principal.tenant:
        raise _refuse("wrong_tenant", "approval token is for another tenant")
    if grant.code_sha256 != code_sha256:
        raise _refuse("code_mismatch", "approval token was granted for different code")
    for key, value in ctx.request.limits.model_dump(exclude_none=True).items():
        ceiling = grant.limits.get(key)
        if ceiling is not None and value > ceiling:
            raise _refuse("limits_exceed_approval", f"{key} {value} is over the approved {ceiling}")
    extra = set(ctx.request.network.egress) - set(grant.egress)
    if extra:
        raise _refuse("egress_not_approved", f"egress not approved: {sorted(extra)}")
    try:
        approval = await svc.approvals.redeem(grant)
    except LookupError:
        raise _refuse("unknown_approval", "approval token names no approval") from None
    except PermissionError as exc:
        raise _refuse("reused", f"approval token refused: {exc}") from None
    ctx.grant = grant
    ctx.approval = {
        "present": True,
        "id": approval.id,
        "approver": approval.approver,
        "code_sha256_match": True,
        "expires_at": iso(grant.expires_at),
    }


async def hold_for_approval(ctx: ExecContext, svc: Services) -> None:
    decision = ctx.decision
    assert decision is not None
    if not decision.require_approval:
        return
    reasons = [decision.approval_reason] if decision.approval_reason else ["approval required"]
    approval = await svc.approvals.hold(ctx, reasons, decision.approval_ttl_s)
    raise Held(approval)
