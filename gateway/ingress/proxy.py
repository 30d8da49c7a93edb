"""`ingress.routes`: path prefixes reverse-proxied to upstreams, registered after
every gateway route. A request matching one of the route's intercept rules runs
through the pipeline (ingress "proxy") and is answered in the upstream's shape;
everything else passes through (gateway/proxy/forward.py). Every request is audited.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn

import aiohttp
from aiohttp import web

from gateway import errors
from gateway.admission.gate import tenant_label
from gateway.appkeys import PIPELINE, SERVICES
from gateway.auth.tokens import Principal
from gateway.context import ExecContext
from gateway.decoders import read_json
from gateway.errors import GatewayError
from gateway.executions.results import held_body
from gateway.ingress.rest import audit_edge, bearer_token, read_body
from gateway.json_codec import json_response
from gateway.models import ExecutionRequest
from gateway.proxy.forward import Route, pass_through
from gateway.proxy.intercept import AmbiguousPath, answer, checked_path, path_rules, request_body
from gateway.settings.ingress import InterceptSettings, RouteSettings
from gateway.settings.model import Settings
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
    # As-is bytes both ways (no decompression), no cookies kept, no env proxies, no
    # headers the caller did not send (aiohttp would add Accept-Encoding and its UA).
    async with aiohttp.ClientSession(
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        trust_env=False,
        skip_auto_headers=("Accept-Encoding", "User-Agent"),
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


# Methods that may reach an intercepted path's upstream without a body.
_BODYLESS = frozenset({"GET", "HEAD", "OPTIONS", "DELETE"})


def _handler(index: int) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        route: Route = request.app[ROUTES][index]
        try:
            path = checked_path(request.rel_url.raw_path)
        except AmbiguousPath as exc:
            # Decided once, here: no spelling can mean one path to us and another upstream.
            await _refuse(request, GatewayError(errors.INVALID_REQUEST, f"path: {exc}"))
        rules = path_rules(route.settings, path)
        method = request.method.upper()
        rule = next((r for r in rules if r.method == method), None)
        if rule is not None:
            return await _intercept(request, route.settings, rule)
        if rules and (request.body_exists or method not in _BODYLESS):
            # An intercepted path under another method would carry its body unseen.
            allow = ", ".join(sorted({r.method for r in rules}))
            await _refuse(
                request,
                GatewayError(
                    errors.METHOD_NOT_ALLOWED,
                    f"{path} takes {allow} (run by the gateway); other methods carry no body",
                    headers={"Allow": allow},
                ),
            )
        return await _forward(request, route)

    return handle


async def _audit(request: web.Request, type_: str, principal: Any, **fields: Any) -> None:
    await audit_edge(
        request, type_, principal, "proxy", method=request.method, path=request.path, **fields
    )


async def _refuse(
    request: web.Request, exc: GatewayError, principal: Principal | None = None
) -> NoReturn:
    type_ = _AUDIT_TYPES.get(exc.code, "request.rejected")
    await _audit(request, type_, principal, code=exc.code, outcome=exc.kind.outcome)
    raise exc


_AUDIT_TYPES = {
    errors.UNAUTHENTICATED.code: "auth.failed",
    errors.FORBIDDEN.code: "auth.failed",
    errors.RATE_LIMITED.code: "rate.limited",
}


async def _admit(request: web.Request, route: Route) -> Principal | None:
    """A pass-through's caller: a valid token holding the route's scope, within its
    tenant's request rate (auth = "none": anyone, unlimited)."""
    settings = route.settings
    if settings.auth == "none":
        return None
    svc = request.app[SERVICES]
    try:
        principal = await verify_bearer(svc, bearer_token(request))
    except GatewayError as exc:
        await _refuse(request, exc)
    scope = settings.required_scope
    if scope not in principal.scopes:
        await _refuse(
            request,
            GatewayError(
                errors.FORBIDDEN,
                f"token lacks scope {scope}",
                reason="missing_scope",
                scope=scope,
            ),
            principal,
        )
    label = tenant_label(svc.settings, principal.tenant)
    try:
        await svc.admission.spend_rate(principal.tenant, svc.settings.tenant(principal.tenant))
    except GatewayError as exc:
        svc.metrics.rate_limited(label, exc.code)
        await _refuse(request, exc, principal)
    return principal


async def _forward(request: web.Request, route: Route) -> web.StreamResponse:
    principal = await _admit(request, route)

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
