"""Operator endpoints (scope `admin:escape-test`): run the escape self-test on
demand, and put a backend it took out of service back in."""

from __future__ import annotations

from aiohttp import web

from gateway import errors
from gateway.appkeys import SERVICES
from gateway.errors import GatewayError
from gateway.escape.report import as_json
from gateway.escape.selftest import SelfTest
from gateway.ingress.rest import authenticated

routes = web.RouteTableDef()
SELFTEST = web.AppKey("selftest", SelfTest)
SCOPE = "admin:escape-test"


async def _operator(request: web.Request) -> str:
    principal = await authenticated(request)
    if SCOPE not in principal.scopes:
        raise GatewayError(errors.FORBIDDEN, f"token lacks scope {SCOPE}", scope=SCOPE)
    return principal.sub


def _backend(request: web.Request, name: str) -> str:
    if name not in request.app[SERVICES].backends:
        raise GatewayError(errors.NOT_FOUND, f"no backend named {name!r}")
    return name


@routes.post("/v1/admin/escape-test")
async def escape_test(request: web.Request) -> web.Response:
    await _operator(request)
    wanted = request.query.get("backend")
    names = [_backend(request, wanted)] if wanted else list(request.app[SERVICES].backends)
    results = await request.app[SELFTEST].run(names)
    return web.json_response({"results": [as_json(r) for r in results]})


@routes.post("/v1/admin/backends/{name}/clear")
async def clear(request: web.Request) -> web.Response:
    subject = await _operator(request)
    name = _backend(request, request.match_info["name"])
    return web.json_response(await request.app[SELFTEST].clear(name, subject))
