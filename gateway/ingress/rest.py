"""The REST ingress: `POST /v1/executions` and `GET /v1/executions/{id}`."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from gateway import errors
from gateway.appkeys import PIPELINE, SERVICES
from gateway.auth.tokens import Principal
from gateway.content_coding import content_codings, decode_body
from gateway.context import ExecContext, new_id
from gateway.decoders import decode_json_body
from gateway.errors import GatewayError, invalid_field
from gateway.executions.live import follow_execution
from gateway.executions.results import held_body
from gateway.ingress.sse import open_stream, send, wants_events
from gateway.json_codec import json_response
from gateway.stages.auth import verify_bearer

routes = web.RouteTableDef()


def bearer_token(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


async def read_body(request: web.Request) -> bytes:
    limit = request.app[SERVICES].settings.server.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise GatewayError(errors.TOO_LARGE, f"body over {limit} bytes", limit_bytes=limit)
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise GatewayError(
            errors.TOO_LARGE, f"body over {limit} bytes", limit_bytes=limit
        ) from None
    # The server keeps bodies as received (gateway/content_coding.py says why).
    return await decode_body(body, content_codings(request.headers), limit)


def new_context(request: web.Request, ingress: str, body: bytes) -> ExecContext:
    return ExecContext(
        ingress=ingress,
        source_ip=request.remote or "",
        bearer=bearer_token(request),
        payload=body,
        decode=decode_json_body,
    )


@routes.post("/v1/executions")
async def create_execution(request: web.Request) -> web.StreamResponse:
    body = await read_body(request)
    ctx = new_context(request, "rest", body)
    if wants_events(request):
        return await _stream_execution(request, ctx)
    ctx = await request.app[PIPELINE].run(ctx)
    if ctx.held is not None:
        return json_response(held_body(ctx), status=202)
    record = await request.app[SERVICES].store.get(ctx.execution_id)
    assert record is not None and record["result"] is not None
    return json_response(record["result"])


async def _stream_execution(request: web.Request, ctx: ExecContext) -> web.StreamResponse:
    """The same run, answered as events: output as it comes, then the result.

    Until the program is handed to a sandbox the request can still be refused, and
    then the answer is the usual JSON error. The pipeline runs in a task of its own:
    a client that goes away stops the events, never the execution or its records."""
    svc = request.app[SERVICES]
    wait_s = _wait_param(request, svc.settings.server.max_wait_s)
    run = asyncio.ensure_future(request.app[PIPELINE].run(ctx))
    running = asyncio.ensure_future(ctx.running.wait())
    try:
        await asyncio.wait({run, running}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        running.cancel()
    if not ctx.running.is_set():
        await run  # a refusal raises here: the error middleware answers in JSON
        if ctx.held is None:
            raise GatewayError(errors.INTERNAL, "execution ended without running")
        resp = await open_stream(request)
        await send(resp, "held", held_body(ctx))
        if wait_s > 0:
            follow = follow_execution(svc.store, svc.live, ctx.execution_id, wait_s)
            async for event, data in follow:
                if event != "held" and not await send(resp, event, data):
                    break
        return resp
    resp = await open_stream(request)
    connected = True
    live = svc.live.get(ctx.execution_id)
    if live is not None:
        async for batch in live.follow():
            for chunk in batch:
                data = {"stream": chunk.stream, "text": chunk.text}
                connected = connected and await send(resp, "output", data)
    try:
        # Shielded: the records are durable before `result` is sent, and the run
        # finishes even if this handler is cancelled.
        await asyncio.shield(run)
    except GatewayError as exc:
        if connected:
            await send(resp, "error", exc.body())
        return resp
    record = await svc.store.get(ctx.execution_id)
    assert record is not None and record["result"] is not None
    if connected:
        await send(resp, "result", record["result"])
    return resp


@routes.get("/v1/executions/{execution_id}")
async def get_execution(request: web.Request) -> web.Response:
    svc = request.app[SERVICES]
    principal = await authenticated(request)
    wait_s = _wait_param(request, svc.settings.server.max_wait_s)
    record = await svc.store.get(request.match_info["execution_id"], wait_s=wait_s)
    # Another tenant's execution is indistinguishable from a missing one.
    if record is None or record["tenant"] != principal.tenant:
        raise GatewayError(errors.NOT_FOUND, "no such execution")
    return json_response(record)


@routes.get("/v1/executions/{execution_id}/events")
async def execution_events(request: web.Request) -> web.StreamResponse:
    """Follow one execution of the caller's tenant as events (see _stream_execution)."""
    svc = request.app[SERVICES]
    principal = await authenticated(request)
    wait_s = _wait_param(request, svc.settings.server.max_wait_s)
    execution_id = request.match_info["execution_id"]
    record = await svc.store.get(execution_id)
    if record is None or record["tenant"] != principal.tenant:
        raise GatewayError(errors.NOT_FOUND, "no such execution")
    resp = await open_stream(request)
    async for event, data in follow_execution(svc.store, svc.live, execution_id, wait_s):
        if not await send(resp, event, data):
            break
    return resp


async def authenticated(request: web.Request, ingress: str = "rest") -> Principal:
    """Verify the bearer of a non-pipeline request; a failure is audited like any other."""
    svc = request.app[SERVICES]
    try:
        return await verify_bearer(svc, bearer_token(request))
    except GatewayError as exc:
        await audit_edge(
            request,
            "auth.failed",
            None,
            ingress,
            path=request.path,
            code=exc.code,
            outcome=exc.kind.outcome,
            message=exc.message,
        )
        raise


async def audit_edge(
    request: web.Request, type_: str, principal: Principal | None, ingress: str, **fields: Any
) -> None:
    """A durable record of something an ingress did outside the pipeline."""
    await request.app[SERVICES].audit.append(
        type_,
        request_id=new_id("req"),
        execution_id=None,
        tenant=principal.tenant if principal else None,
        subject=principal.sub if principal else None,
        ingress=ingress,
        source_ip=request.remote or "",
        **fields,
    )


def _wait_param(request: web.Request, max_wait_s: float) -> float:
    raw = request.query.get("wait")
    if raw is None:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise invalid_field("wait", "must be a number of seconds") from None
    if not 0 <= value <= max_wait_s or value != value:
        raise invalid_field("wait", f"must be between 0 and {max_wait_s}")
    return value
