"""What stands between a browser and the console's pages and forms.

Every response gets a strict Content-Security-Policy (only the console's own
script and stylesheet; no inline code; no framing) and the other headers that keep
a page to itself. Pages require a session with a scope; forms that change state
require the session's CSRF token *and* a same-origin `Origin` (or, lacking one,
`Referer`): either alone would already stop a cross-site post, both fail closed.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from urllib.parse import urlsplit

from aiohttp import web

from gateway import errors
from gateway.console import html
from gateway.console.session import COOKIE, SESSIONS, Session
from gateway.errors import GatewayError

log = logging.getLogger(__name__)

CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    # Not no-referrer: under it browsers send `Origin: null` on our own form posts.
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=(), payment=()",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class SignInRequired(Exception):
    """No (live) session: the browser goes to the sign-in page."""


def session_of(request: web.Request) -> Session | None:
    return request.app[SESSIONS].get(request.cookies.get(COOKIE))


def require(request: web.Request, *scopes: str) -> Session:
    """The session, if it holds one of `scopes`; otherwise sign-in or a bare 403."""
    session = session_of(request)
    if session is None:
        raise SignInRequired()
    if not session.has(*scopes):
        raise GatewayError(errors.FORBIDDEN, "your token does not carry a scope for this page")
    return session


def same_origin(request: web.Request) -> bool:
    """The request came from one of our own pages (browsers set Origin on POST)."""
    source = request.headers.get("Origin") or request.headers.get("Referer")
    if not source or source == "null":
        return False
    parts = urlsplit(source)
    return parts.scheme in ("http", "https") and parts.netloc == request.host


async def form_of(request: web.Request, session: Session | None) -> dict[str, str]:
    """A state-changing form, checked: same origin and (with a session) its CSRF token."""
    if not same_origin(request):
        raise GatewayError(errors.FORBIDDEN, "cross-origin form refused", reason="csrf")
    data = await request.post()
    form = {k: v for k, v in data.items() if isinstance(v, str)}
    if session is not None and not session.csrf_ok(form.get("csrf")):
        raise GatewayError(errors.FORBIDDEN, "missing or wrong CSRF token", reason="csrf")
    return form


def _error_page(
    request: web.Request, status: int, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    # Only the refusal itself: a 403 carries no data of the page it refuses.
    session = session_of(request)
    body = f'<p class="error">{html.esc(message)}</p>'
    if session is None:
        body += '<p><a href="/console/signin">Sign in</a></p>'
    titles = {401: "Not signed in", 403: "Forbidden", 404: "Not found", 429: "Too many attempts"}
    response = html.page(titles.get(status, "Error"), body, session, status=status)
    response.headers.update(headers or {})
    return response


@web.middleware
async def console_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        response = await handler(request)
    except SignInRequired:
        response = html.redirect("/console/signin")
    except GatewayError as exc:
        response = _error_page(request, exc.status, exc.message, exc.headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = _error_page(request, exc.status, exc.reason)
    response.headers.update(HEADERS)
    response.headers.setdefault("Cache-Control", "no-store")
    return response
