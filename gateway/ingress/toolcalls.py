"""`POST /v1/tool-calls`: tool calls in, tool replies out, same protocol, same ids.

Every code-running call goes through the same pipeline as `POST /v1/executions`;
several calls run concurrently. A denial, a held approval or a failed run is a tool
reply the model can read (never a 500), so the agent loop can react.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from gateway import errors
from gateway.appkeys import PIPELINE, SERVICES
from gateway.context import ExecContext
from gateway.decoders import read_json
from gateway.errors import GatewayError, invalid_field
from gateway.executions.results import held_body
from gateway.ingress.rest import authenticated, bearer_token, read_body
from gateway.json_codec import json_response
from gateway.mcp.tools import RESULT_KEYS
from gateway.models import ExecutionRequest, format_validation_errors
from gateway.pipeline import Pipeline
from gateway.toolcalls import INGRESS, ToolCall, ToolCallError, parse, render, to_request

routes = web.RouteTableDef()


def _decoder(
    request: ExecutionRequest | None, problem: GatewayError | None
) -> Callable[[ExecContext], ExecutionRequest]:
    # Arguments were read before the pipeline; it reports their problems in order.
    def decode(ctx: ExecContext) -> ExecutionRequest:
        if problem is not None:
            raise problem
        assert request is not None
        return request

    return decode


async def _run_one(
    pipeline: Pipeline, http: web.Request, call: ToolCall
) -> tuple[ToolCall, dict[str, Any], bool]:
    svc = http.app[SERVICES]
    tool = svc.settings.ingress.tools.get(call.name)
    if tool is None:
        known = ", ".join(sorted(svc.settings.ingress.tools))
        return (
            call,
            {
                "error": {
                    "code": "unknown_tool",
                    "message": f"{call.name!r} is not a code tool here ({known})",
                }
            },
            True,
        )
    request: ExecutionRequest | None = None
    problem: GatewayError | None = None
    try:
        request = to_request(call, tool)
    except ToolCallError as exc:
        problem = invalid_field(exc.field, str(exc))
    except ValidationError as exc:
        fields = format_validation_errors(exc.errors())
        problem = GatewayError(errors.INVALID_REQUEST, "invalid tool arguments", fields=fields)
    ctx = ExecContext(
        ingress=INGRESS[call.protocol],
        source_ip=http.remote or "",
        bearer=bearer_token(http),
        payload=call.arguments,
        decode=_decoder(request, problem),
        tool_name=call.name,
    )
    try:
        await pipeline.run(ctx)
    except GatewayError as exc:
        return call, exc.body(), True
    if ctx.held is not None:
        held = held_body(ctx)
        held["message"] = (
            "Held for human approval. The result will be available at "
            f"GET /v1/executions/{ctx.execution_id}?wait=60 once a person approves."
        )
        return call, held, False
    record = await svc.store.get(ctx.execution_id)
    assert record is not None and record["result"] is not None
    result = record["result"]
    content = {k: result[k] for k in RESULT_KEYS if k in result}
    return call, content, result["status"] != "ok"


@routes.post("/v1/tool-calls")
async def tool_calls(request: web.Request) -> web.Response:
    svc = request.app[SERVICES]
    await authenticated(request, "tool-calls")  # a bad token is one 401, not one error per call
    body = await read_body(request)
    payload = read_json(body)
    try:
        protocol, calls = parse(payload)
    except ToolCallError as exc:
        raise invalid_field(exc.field, str(exc)) from None
    limit = svc.settings.ingress.max_calls_per_request
    if len(calls) > limit:
        raise invalid_field("body", f"at most {limit} tool calls per request")
    pipeline = request.app[PIPELINE]
    replies = await asyncio.gather(*(_run_one(pipeline, request, c) for c in calls))
    return json_response(render(protocol, list(replies)))
