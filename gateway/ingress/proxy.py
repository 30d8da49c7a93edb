"""`ingress.routes`: path prefixes reverse-proxied to upstreams, registered after
every gateway route. A request matching one of the route's intercept rules runs
through the pipeline (ingress "proxy") and is answered in the upstream's shape;
everything else passes through (gateway/proxy.py). Every request is audited.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from gateway.appkeys import PIPELINE, SERVICES
from gateway.context import ExecContext
from gateway.decoders import read_json
from gateway.errors import GatewayError
from gateway.ingress.rest import audit_edge, bearer_token, held_body, read_body
from gateway.json_codec import json_response
from gateway.models import ExecutionRequest
from gateway.proxy import Route, pass_through
from gateway.proxy_intercept import answer, find_rule, request_body
from gateway.settings import Settings
from gateway.settings_ingress import InterceptSettings, RouteSettings
from gateway.stages.auth import verify_bearer

HTTP = web.AppKey("proxy_http", aiohttp.ClientSession)
ROUTES = web.AppKey("proxy_routes", list)  # list[Route], in settings order


async def proxy_ctx(app: web.Application) -> AsyncIterator[None]:
    """One client session for every route; each route's credential read once."""
    routes: list[Route] = []
    for settings in app[SERVICES].settings.ingress.routes:
        credential = None
        if settings.credential_header and settings.credential_value_file:
            path = Path(settings.credential_value_file)
            try:
                value = await asyncio.to_thread(path.read_text, encoding="utf-8")
            except OSError as exc:
                raise RuntimeError(f"ingress.routes {settings.prefix}: {exc}") from None
            credential = (settings.credential_header, value.strip())
        routes.append(Route(settings, credential))
    app[ROUTES] = routes
    # As-is bytes both ways (no decompression), no cookies kept, no env proxies.
    async with aiohttp.ClientSession(
        auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False
    ) as http:
        app[HTTP] = http
        yield


def add_routes(app: web.Application, settings: Settings) -> None:
    """Register each prefix (after the gateway's own routes; prefixes cannot overlap them)."""
    if not settings.ingress.routes:
        return
    app.cleanup_ctx.append(proxy_ctx)
    for index, route in enumerate(settings.ingress.routes):
        handler = _handler(index)
        app.router.add_route("*", route.prefix, handler)
        app.router.add_route("*", route.prefix + "/{tail:.*}", handler)


def _handler(index: int) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        route: Route = request.app[ROUTES][index]
        rule = find_rule(route.settings, request.method, request.path)
        if rule is not None:
            return await _intercept(request, route.settings, rule)
        return await _forward(request, route)

    return handle


async def _audit(request: web.Request, type_: str, principal: Any, **fields: Any) -> None:
    await audit_edge(
        request, type_, principal, "proxy", method=request.method, path=request.path, **fields
    )


async def _forward(request: web.Request, route: Route) -> web.StreamResponse:
    svc = request.app[SERVICES]
    principal = None
    if route.settings.auth == "jwt":
        try:
            principal = await verify_bearer(svc, bearer_token(request))
        except GatewayError as exc:
            await _audit(request, "auth.failed", None, code=exc.code, outcome=exc.kind.outcome)
            raise

    async def on_answer(status: int) -> None:
        await _audit(
            request, "proxy.forwarded", principal, route=route.settings.prefix, status=status
        )

    try:
        return await pass_through(request.app[HTTP], request, route, on_answer)
    except GatewayError as exc:
        await _audit(
            request,
            "proxy.failed",
            principal,
            route=route.settings.prefix,
            code=exc.code,
            outcome=exc.kind.outcome,
        )
        raise


def _decoder(rule: InterceptSettings) -> Callable[[ExecContext], ExecutionRequest]:
    def decode(ctx: ExecContext) -> ExecutionRequest:
        body = read_json(ctx.payload)
        return ExecutionRequest.model_validate(request_body(rule, body))

    return decode


async def _intercept(
    request: web.Request, route: RouteSettings, rule: InterceptSettings
) -> web.StreamResponse:
    body = await read_body(request)
    ctx = ExecContext(
        ingress="proxy",
        source_ip=request.remote or "",
        bearer=bearer_token(request),
        payload=body,
        decode=_decoder(rule),
        tool_name=f"proxy:{route.prefix}",
    )
    try:
        await request.app[PIPELINE].run(ctx)
    except GatewayError as exc:
        fields = {"status": "error", "error": exc.body()["error"]}
        return json_response(answer(rule, fields), status=exc.status, headers=exc.headers)
    if ctx.held is not None:
        held = held_body(ctx)
        fields = {
            "status": "pending_approval",
            "approval_id": held["approval_id"],
            "execution_id": held["execution_id"],
            "error": {
                "code": "pending_approval",
                "message": f"held for approval; GET /v1/executions/{ctx.execution_id}?wait=60",
            },
        }
        return json_response(answer(rule, fields), status=202)
    record = await request.app[SERVICES].store.get(ctx.execution_id)
    assert record is not None and record["result"] is not None
    result = record["result"]
    keys = ("stdout", "stderr", "exit_code", "status", "execution_id")
    return json_response(answer(rule, {k: result[k] for k in keys}))
