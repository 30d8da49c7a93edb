"""`/mcp`: MCP over Streamable HTTP (POST messages, GET stream, DELETE session).

Both revisions on one endpoint: a message whose `params._meta` names its protocol
version is 2026-07-28 (stateless; headers must agree with the body), anything else
is the 2025-11-25 handshake revision (sessions). Every request needs a bearer JWT
and, when it carries an Origin, an allowed one. Answers are JSON, never SSE.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway import errors
from gateway.appkeys import PIPELINE, SERVICES
from gateway.auth.tokens import Principal
from gateway.errors import GatewayError
from gateway.ingress.rest import audit_edge, bearer_token, read_body
from gateway.ingress.sse import open_stream, send, wants_events
from gateway.json_codec import JsonError, json_response, loads
from gateway.mcp.protocol import (
    HANDSHAKE_VERSIONS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    MODERN_STATUS,
    MODERN_VERSIONS,
    PARSE_ERROR,
    SERVER_INFO_META,
    SESSION_HEADER,
    VERSION_HEADER,
    Message,
    RpcError,
    check_modern,
    error,
    negotiate,
    parse,
    result,
)
from gateway.mcp.server import McpServer, ProgressSink
from gateway.mcp.upstream import Upstream
from gateway.pipeline import Pipeline
from gateway.services import Services
from gateway.stages.auth import verify_bearer
from gateway.stages.tool import TOOL_STAGES

log = logging.getLogger(__name__)

MCP = web.AppKey("mcp", McpServer)
SERVER_INFO = {"name": "execgate", "version": "0.1"}
CAPABILITIES = {"tools": {"listChanged": False}}
# 2026-07-28 cacheable results carry caching hints.
NO_CACHE = {"ttlMs": 0, "cacheScope": "private"}
INSTRUCTIONS = "Code tools run in a fresh sandbox under policy; results are audited."

routes = web.RouteTableDef()


async def mcp_ctx(app: web.Application) -> AsyncIterator[None]:
    """The MCP server and its upstream client, after the shared services exist."""
    services = app[SERVICES]
    settings = services.settings.ingress.mcp
    upstream: Upstream | None = None
    if settings.upstream_url:
        credential = None
        if settings.upstream_auth_value_file:
            path = Path(settings.upstream_auth_value_file)
            try:
                credential = (await _read_text(path)).strip()
            except OSError as exc:
                raise RuntimeError(f"ingress.mcp.upstream_auth_value_file: {exc}") from None
        upstream = Upstream(settings, credential)
        await upstream.start()
    app[MCP] = McpServer(services, app[PIPELINE], Pipeline(services, TOOL_STAGES), upstream)
    try:
        yield
    finally:
        if upstream is not None:
            await upstream.close()


async def _read_text(path: Path) -> str:
    return await asyncio.to_thread(path.read_text, encoding="utf-8")


async def _audit(
    request: web.Request, type_: str, principal: Principal | None, **fields: Any
) -> None:
    await audit_edge(request, type_, principal, "mcp", **fields)


async def _admit(request: web.Request) -> tuple[Services, Principal, str]:
    """Origin, then the bearer token: (services, principal, token) or an error."""
    svc = request.app[SERVICES]
    origin = request.headers.get("Origin")
    # Browsers send Origin; a page on another site must not drive a local agent's
    # tools (DNS rebinding). Clients that are not browsers send none.
    if origin is not None and origin.rstrip("/") not in svc.settings.ingress.mcp.allowed_origins:
        await _audit(
            request, "mcp.rejected", None, code="forbidden", reason="origin", origin=origin
        )
        raise GatewayError(errors.FORBIDDEN, "origin not allowed", reason="origin")
    token = bearer_token(request)
    try:
        principal = await verify_bearer(svc, token)
    except GatewayError as exc:
        await _audit(
            request, "auth.failed", None, code=exc.code, outcome=exc.kind.outcome, path=request.path
        )
        exc.headers["WWW-Authenticate"] = 'Bearer realm="execgate"'
        raise
    assert token is not None
    return svc, principal, token


def _json(body: dict[str, Any], status: int = 200, **headers: str) -> web.Response:
    return json_response(body, status=status, headers=headers or None)


@routes.post("/mcp")
async def post(request: web.Request) -> web.StreamResponse:
    _, principal, token = await _admit(request)
    server = request.app[MCP]
    try:
        raw = loads(await read_body(request))
    except JsonError as exc:
        await _audit(
            request,
            "mcp.rejected",
            principal,
            code="invalid_request",
            rpc_code=PARSE_ERROR,
            reason=str(exc),
        )
        fields = [{"field": exc.where, "message": exc.reason}]
        return _json(error(None, RpcError(PARSE_ERROR, f"parse error: {exc}", data=fields)), 400)
    try:
        msg = parse(raw)
    except RpcError as exc:
        return _json(error(raw.get("id") if isinstance(raw, dict) else None, exc), exc.status)
    headers = {k.lower(): v for k, v in request.headers.items()}
    try:
        if msg.modern:
            check_modern(msg, headers)
            if msg.kind != "request":
                return web.Response(status=202)
            if (progress := _progress_token(request, msg)) is not None:
                return await _answer_streamed(
                    request, server, msg, principal, token, True, progress
                )
            return _json(await _answer(request, server, msg, principal, token, True))
        return await _handshake_era(request, server, msg, principal, token, headers)
    except RpcError as exc:
        status = MODERN_STATUS.get(exc.code, exc.status) if msg.modern else exc.status
        await _audit(
            request,
            "mcp.rejected",
            principal,
            code="invalid_request",
            rpc_code=exc.code,
            reason=exc.message,
            method=msg.method,
        )
        return _json(error(msg.id, exc), status)


async def _handshake_era(
    request: web.Request,
    server: McpServer,
    msg: Message,
    principal: Principal,
    token: str,
    headers: dict[str, str],
) -> web.StreamResponse:
    if msg.method == "initialize" and msg.kind == "request":
        version = negotiate(msg.params.get("protocolVersion"))
        session = server.sessions.open(principal, version)
        await _audit(
            request,
            "mcp.session_opened",
            principal,
            session=session.id[:8],
            protocol_version=version,
        )
        answer = result(
            msg.id,
            {
                "protocolVersion": version,
                "capabilities": CAPABILITIES,
                "serverInfo": SERVER_INFO,
                "instructions": INSTRUCTIONS,
            },
        )
        return _json(answer, **{SESSION_HEADER: session.id})
    asked = headers.get(VERSION_HEADER.lower())
    if asked is not None and asked not in HANDSHAKE_VERSIONS:
        raise RpcError(INVALID_REQUEST, f"unsupported {VERSION_HEADER} {asked!r}", status=400)
    session_id = headers.get(SESSION_HEADER.lower())
    if not session_id:
        raise RpcError(INVALID_REQUEST, f"missing {SESSION_HEADER} (initialize first)", status=400)
    session = server.sessions.get(session_id, principal)
    if session is None:
        raise RpcError(INVALID_REQUEST, "unknown or expired session", status=404)
    if msg.kind != "request":
        return web.Response(status=202)  # notifications and responses: accepted
    if (progress := _progress_token(request, msg)) is not None:
        return await _answer_streamed(request, server, msg, principal, token, False, progress)
    return _json(await _answer(request, server, msg, principal, token, False))


def _progress_token(request: web.Request, msg: Message) -> str | int | None:
    """A tools/call that asked for progress, from a client that takes an SSE answer."""
    if msg.method != "tools/call" or not wants_events(request):
        return None
    meta = msg.params.get("_meta")
    token = meta.get("progressToken") if isinstance(meta, dict) else None
    if isinstance(token, bool) or not isinstance(token, str | int):
        return None
    return token


async def _answer_streamed(
    request: web.Request,
    server: McpServer,
    msg: Message,
    principal: Principal,
    token: str,
    modern: bool,
    progress_token: str | int,
) -> web.StreamResponse:
    """tools/call answered as an SSE stream: notifications/progress with the output so
    far while the code runs, then the response (the same as the JSON answer)."""
    resp: web.StreamResponse | None = None

    async def progress(params: dict[str, Any]) -> bool:
        nonlocal resp
        if resp is None:
            resp = await open_stream(request)
        note = {
            "jsonrpc": "2.0",
            "method": "notifications/progress",
            "params": {"progressToken": progress_token, **params},
        }
        return await send(resp, "message", note)

    answer = await _answer(request, server, msg, principal, token, modern, progress)
    if resp is None:
        # Nothing ran (refused, held): the answer goes in one piece.
        return _json(answer)
    await send(resp, "message", answer)
    return resp


async def _answer(
    request: web.Request,
    server: McpServer,
    msg: Message,
    principal: Principal,
    token: str,
    modern: bool,
    progress: ProgressSink | None = None,
) -> dict[str, Any]:
    value: dict[str, Any]
    if msg.method == "tools/list":
        tools, upstream = await server.list_tools(principal)
        await _audit(request, "mcp.tools_listed", principal, count=len(tools), upstream=upstream)
        # The list depends on the caller's scopes: never shared, never reused.
        value = {"tools": tools, **(NO_CACHE if modern else {})}
    elif msg.method == "tools/call":
        value = await server.call_tool(principal, token, request.remote or "", msg.params, progress)
    elif msg.method == "ping" and not modern:
        value = {}
    elif msg.method == "server/discover" and modern:
        value = {
            "supportedVersions": [*MODERN_VERSIONS, *HANDSHAKE_VERSIONS],
            "capabilities": CAPABILITIES,
            "instructions": INSTRUCTIONS,
            "_meta": {SERVER_INFO_META: SERVER_INFO},
            **NO_CACHE,
        }
    else:
        raise RpcError(METHOD_NOT_FOUND, f"method not found: {msg.method}")
    if modern:
        value.setdefault("resultType", "complete")
    return result(msg.id, value)


@routes.get("/mcp")
async def get(request: web.Request) -> web.StreamResponse:
    await _admit(request)
    # No server-initiated messages: the spec's answer is 405.
    return web.Response(status=405, headers={"Allow": "POST, DELETE"})


@routes.delete("/mcp")
async def delete(request: web.Request) -> web.StreamResponse:
    _, principal, _ = await _admit(request)
    server = request.app[MCP]
    session_id = request.headers.get(SESSION_HEADER)
    if not session_id:
        return _json(error(None, RpcError(INVALID_REQUEST, f"missing {SESSION_HEADER}")), 400)
    if server.sessions.get(session_id, principal) is None:
        return _json(error(None, RpcError(INVALID_REQUEST, "unknown or expired session")), 404)
    server.sessions.end(session_id)
    await _audit(request, "mcp.session_closed", principal, session=session_id[:8])
    return web.Response(status=204)
