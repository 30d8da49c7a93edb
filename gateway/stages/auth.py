"""authenticate: bearer JWT -> principal. authorize: the scope the request needs."""

from __future__ import annotations

from gateway import errors
from gateway.auth.tokens import AuthError, Principal
from gateway.context import ExecContext
from gateway.errors import GatewayError
from gateway.services import Services


async def verify_bearer(svc: Services, token: str | None) -> Principal:
    if not token:
        raise GatewayError(errors.UNAUTHENTICATED, "missing bearer token", reason="missing")
    try:
        return await svc.verifier.verify(token)
    except AuthError as exc:
        raise GatewayError(
            errors.UNAUTHENTICATED, "invalid bearer token", reason=exc.reason
        ) from None


async def authenticate(ctx: ExecContext, svc: Services) -> None:
    token, ctx.bearer = ctx.bearer, None
    if ctx.principal is None:
        ctx.principal = await verify_bearer(svc, token)
    # else: an execution held for approval, authenticated when it was requested. Only
    # the approval desk builds such a context; no ingress can set a principal.
    ctx.tenant = svc.settings.tenant(ctx.principal.tenant)


async def authorize(ctx: ExecContext, svc: Services) -> None:
    assert ctx.principal is not None and ctx.request is not None
    needed = f"exec:{ctx.request.language}"
    if needed not in ctx.principal.scopes:
        raise GatewayError(
            errors.FORBIDDEN, f"token lacks scope {needed}", reason="missing_scope", scope=needed
        )
