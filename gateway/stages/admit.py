"""admit: rate, quota and a concurrency slot for the tenant; the limits that apply."""

from __future__ import annotations

from gateway import errors
from gateway.admission.gate import tenant_label
from gateway.admission.limits import clamp
from gateway.context import ExecContext
from gateway.errors import GatewayError
from gateway.services import Services


async def admit(ctx: ExecContext, svc: Services) -> None:
    assert ctx.principal and ctx.request and ctx.tenant and ctx.decision and ctx.backend
    obligations = ctx.decision.obligations
    if obligations.backend is not None and obligations.backend != ctx.backend:
        if obligations.backend not in svc.backends:
            # Policy demands a sandbox we do not have: nothing runs anywhere else.
            raise GatewayError(
                errors.BACKEND_UNAVAILABLE,
                f"policy requires backend {obligations.backend!r}, which is not enabled",
                decision_id=ctx.decision.decision_id,
            )
        ctx.backend = obligations.backend
    backend = svc.backends[ctx.backend]
    if ctx.request.language not in backend.capabilities.languages:
        raise GatewayError(
            errors.BACKEND_UNAVAILABLE,
            f"backend {ctx.backend} does not serve {ctx.request.language}",
        )
    if obligations.egress and not backend.capabilities.egress:
        # Running without the network the policy granted would silently change the
        # program's meaning; refuse instead.
        raise GatewayError(
            errors.BACKEND_UNAVAILABLE,
            f"backend {ctx.backend} cannot provide network egress",
            decision_id=ctx.decision.decision_id,
        )
    ceilings = obligations.as_dict()
    if ctx.grant is not None:
        # What a person approved is a ceiling too.
        for key, value in ctx.grant.limits.items():
            ceilings[key] = min(value, ceilings.get(key, value))
    ctx.limits = clamp(
        ctx.request.limits.model_dump(exclude_none=True),
        ceilings,
        ctx.tenant,
        backend.capabilities.max_limits,
    )
    label = tenant_label(svc.settings, ctx.principal.tenant)
    try:
        slot = await svc.admission.admit(ctx.principal.tenant, ctx.tenant)
    except GatewayError as exc:
        svc.metrics.rate_limited(label, exc.code)
        raise
    ctx.cleanup.push_async_callback(slot.release)
    svc.metrics.admitted(label)
