"""redeem_approval: a presented approval token, verified and spent.
hold_for_approval: a decision that requires a person holds the request.
"""

from __future__ import annotations

from typing import Any

from gateway import errors
from gateway.approvals import binding as approval_binding
from gateway.approvals.records import Approval, iso
from gateway.approvals.tokens import ApprovalTokenError
from gateway.context import ExecContext
from gateway.errors import GatewayError
from gateway.services import Services


class Held(Exception):
    """Not an error: the request waits for a person (202)."""

    def __init__(self, approval: Approval) -> None:
        super().__init__(approval.id)
        self.approval = approval


def _refuse(
    ctx: ExecContext, svc: Services, reason: str, message: str, **extra: Any
) -> GatewayError:
    """A refused token: `approval.refused` (reason, approval, parts that differ) goes
    into the request's audit chain ahead of its terminal record (queued: that record
    takes it along, one fsync for both)."""
    ctx.audit_pending.append(
        svc.audit.queue("approval.refused", **ctx.audit_fields(), reason=reason, **extra)
    )
    return GatewayError(errors.APPROVAL_INVALID, message, reason=reason, **extra)


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
        raise _refuse(
            ctx, svc, exc.reason, f"approval token refused: {exc.reason}", approval_id=None
        ) from None
    # Everything that decides what runs, compared whole: any difference is refused and
    # the token stays unspent (the approved request itself can still run once).
    mismatch = approval_binding.differences(grant.binding, approval_binding.of(ctx))
    if mismatch:
        raise _refuse(
            ctx,
            svc,
            "request_mismatch",
            "approval token was granted for a different request: " + ", ".join(mismatch),
            approval_id=grant.approval_id,
            mismatch=mismatch,
        )
    try:
        approval = await svc.approvals.redeem(grant)
    except LookupError:
        raise _refuse(
            ctx, svc, "unknown_approval", "approval token names no approval",
            approval_id=grant.approval_id,
        ) from None  # fmt: skip
    except PermissionError as exc:
        raise _refuse(
            ctx, svc, "reused", f"approval token refused: {exc}", approval_id=grant.approval_id
        ) from None
    ctx.grant = grant
    ctx.approval = {
        "present": True,
        "id": approval.id,
        "approver": approval.approver,
        "code_sha256_match": True,
        "request_match": True,
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
