"""The web console at `/console/`: approvals, the audit trail, patterns of what code
tried, and health, for people.

A sub-application of the gateway (same process, same services): server-rendered
pages, one stylesheet and one small script shipped in the package, a session
cookie instead of a token in the browser. See THREAT_MODEL.md, "Console".
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web

from gateway.console import (
    approvals_page,
    audit_page,
    health_page,
    patterns_page,
    signin,
    story_page,
)
from gateway.console.chain import CHAIN, ChainStatus
from gateway.console.guard import console_middleware
from gateway.console.session import SESSIONS, SessionStore
from gateway.console.throttle import THROTTLE, SignInThrottle

PREFIX = "/console"
_TYPES = {".css": "text/css", ".js": "text/javascript", ".svg": "image/svg+xml"}
ASSETS = web.AppKey("console_assets", dict)


def _load_assets() -> dict[str, tuple[bytes, str]]:
    """Every shipped asset, read once at start (requests never touch the filesystem)."""
    assets = {}
    for entry in resources.files("gateway.console").joinpath("static").iterdir():
        suffix = entry.name[entry.name.rfind(".") :]
        if suffix in _TYPES:
            assets[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    return assets


async def _asset(request: web.Request) -> web.Response:
    found = request.app[ASSETS].get(request.match_info["name"])
    if found is None:
        raise web.HTTPNotFound()
    body, content_type = found
    return web.Response(body=body, content_type=content_type, headers={"Cache-Control": "no-cache"})


def create_console_app() -> web.Application:
    app = web.Application(middlewares=[console_middleware])
    app[SESSIONS] = SessionStore()
    app[THROTTLE] = SignInThrottle()
    app[CHAIN] = ChainStatus()
    app[ASSETS] = _load_assets()
    app.router.add_get("/static/{name}", _asset)
    for module in (signin, approvals_page, audit_page, story_page, health_page, patterns_page):
        app.add_routes(module.routes)
    return app


def add_console(app: web.Application) -> None:
    """Mount the console on the gateway's app (under /console/)."""
    app.add_subapp(PREFIX, create_console_app())
