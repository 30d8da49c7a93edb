"""Signing in and out: a pasted JWT verified once, exchanged for a session cookie."""

from __future__ import annotations

import math

from aiohttp import web

from gateway import errors
from gateway.appkeys import SERVICES
from gateway.auth.tokens import MAX_TOKEN_BYTES, AuthError
from gateway.console import html
from gateway.console.guard import form_of, require, session_of
from gateway.console.session import (
    CONSOLE_SCOPES,
    COOKIE,
    COOKIE_PATH,
    SESSIONS,
)
from gateway.console.throttle import THROTTLE, source_key
from gateway.errors import GatewayError

routes = web.RouteTableDef()


@routes.get("/")
async def home(request: web.Request) -> web.Response:
    session = session_of(request)
    if session is None:
        return html.redirect("/console/signin")
    for path, _, scopes in html.PAGES:
        if session.has(*scopes):
            return html.redirect(path)
    return html.redirect("/console/signin")  # unreachable: sessions hold a console scope


@routes.get("/signin")
async def signin_form(request: web.Request) -> web.Response:
    if session_of(request) is not None:
        return html.redirect("/console/")
    return html.page("Sign in", _FORM)


_FORM = (
    '<form method="post" action="/console/signin" class="card signin">'
    '<label for="token">Paste a JWT with <code>approvals:read</code>, '
    "<code>approvals:decide</code> or <code>audit:read</code></label>"
    '<textarea id="token" name="token" rows="6" autocomplete="off" spellcheck="false" '
    'required></textarea><button type="submit">Sign in</button>'
    '<p class="muted">The token is checked once and not kept: the console holds only who '
    "you are, your scopes and when the token expires.</p></form>"
)


@routes.post("/signin")
async def signin(request: web.Request) -> web.Response:
    svc = request.config_dict[SERVICES]
    form = await form_of(request, None)
    throttle, source = request.app[THROTTLE], source_key(request.remote)
    await _refuse_if_throttled(request, source)
    # Charged before the first await, refunded on success: concurrent guesses from one
    # source cannot all pass the check while their verifications are in flight.
    throttle.failed(source)
    token = form.get("token", "").strip()
    if not token or len(token) > MAX_TOKEN_BYTES:
        raise GatewayError(errors.UNAUTHENTICATED, "paste a token to sign in")
    try:
        principal = await svc.verifier.verify(token)
    except AuthError as exc:
        await svc.audit.append("console.signin_refused", reason=exc.reason)
        raise GatewayError(errors.UNAUTHENTICATED, f"token refused: {exc.reason}") from None
    if not principal.scopes & CONSOLE_SCOPES:
        await svc.audit.append(
            "console.signin_refused",
            tenant=principal.tenant,
            subject=principal.sub,
            reason="no_console_scope",
        )
        raise GatewayError(errors.FORBIDDEN, "this token carries no console scope")
    throttle.refund(source)
    sessions = request.app[SESSIONS]
    # A new identity gets a new session id; an old one in this browser ends here.
    sessions.close(request.cookies.get(COOKIE))
    session_id, session = sessions.open(principal)
    await svc.audit.append(
        "console.signed_in",
        tenant=principal.tenant,
        subject=principal.sub,
        scopes=sorted(session.scopes),
        expires_in_s=sessions.remaining_s(session),
    )
    response = html.redirect("/console/")
    response.set_cookie(
        COOKIE,
        session_id,
        path=COOKIE_PATH,
        max_age=sessions.remaining_s(session),
        httponly=True,
        samesite="Strict",
        secure=_secure(request),
    )
    return response


async def _refuse_if_throttled(request: web.Request, source: str) -> None:
    """429 while `source` is over its failed sign-in rate; audited once per spell."""
    throttle = request.app[THROTTLE]
    wait_s = math.ceil(throttle.retry_after_s(source))
    if wait_s <= 0:
        return
    if throttle.first_refusal(source):
        await request.config_dict[SERVICES].audit.append(
            "console.signin_throttled", source_ip=request.remote, retry_after_s=wait_s
        )
    raise GatewayError(
        errors.RATE_LIMITED,
        f"too many failed sign-ins from your address; try again in {wait_s} s",
        headers={"Retry-After": str(wait_s)},
    )


@routes.post("/signout")
async def signout(request: web.Request) -> web.Response:
    session = require(request, *CONSOLE_SCOPES)
    await form_of(request, session)
    request.app[SESSIONS].close(request.cookies.get(COOKIE))
    response = html.redirect("/console/signin")
    response.del_cookie(COOKIE, path=COOKIE_PATH)
    return response


def _secure(request: web.Request) -> bool:
    # Behind a TLS-terminating proxy the gateway sees http; the public URL says https.
    public = request.config_dict[SERVICES].settings.approvals.public_url
    return request.secure or public.startswith("https://")
