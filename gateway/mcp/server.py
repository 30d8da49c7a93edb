"""What /mcp does with `tools/list` and `tools/call`, whatever the protocol revision.

Code tools run through the same pipeline as `POST /v1/executions` (ingress "mcp");
upstream tools are forwarded with the gateway's own credential, after the guarded
ones have passed the guarded-tool pipeline (policy, approval). Every forward is
audited (`tool.forwarded`) before the answer leaves.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError

from gateway import errors
from gateway.auth.tokens import Principal
from gateway.context import ExecContext
from gateway.errors import GatewayError, invalid_field
from gateway.executions.results import held_body
from gateway.mcp.protocol import APPROVAL_TOKEN_META, INVALID_PARAMS, RpcError
from gateway.mcp.sessions import McpSessions
from gateway.mcp.tools import (
    error_result,
    execution_result,
    held_result,
    may_use_upstream_tool,
    visible_tools,
)
from gateway.mcp.upstream import Upstream, UpstreamError, UpstreamRpcError
from gateway.models import ExecutionRequest, format_validation_errors
from gateway.pipeline import Pipeline
from gateway.services import Services
from gateway.settings.model import ToolSettings
from gateway.stages.tool import canonical_arguments, tool_request
from gateway.toolcalls import ToolCallError, request_from_arguments

log = logging.getLogger(__name__)

# Progress notifications carry the output so far, its last this-many characters.
PROGRESS_TAIL_CHARS = 4096
# Sends one notifications/progress (params without the token); False: the client left.
ProgressSink = Callable[[dict[str, Any]], Awaitable[bool]]


def _code_decoder(tool: ToolSettings, arguments: Any) -> Callable[[ExecContext], ExecutionRequest]:
    # Decoded inside the pipeline, so bad arguments are audited like any bad request.
    def decode(ctx: ExecContext) -> ExecutionRequest:
        try:
            return request_from_arguments(arguments, tool)
        except ToolCallError as exc:
            raise invalid_field(exc.field, str(exc)) from None
        except ValidationError as exc:
            fields = format_validation_errors(exc.errors())
            raise GatewayError(
                errors.INVALID_REQUEST, "invalid tool arguments", fields=fields
            ) from None

    return decode


class McpServer:
    def __init__(
        self,
        services: Services,
        pipeline: Pipeline,
        tool_pipeline: Pipeline,
        upstream: Upstream | None,
    ) -> None:
        self.services = services
        self.settings = services.settings.ingress.mcp
        self.pipeline = pipeline
        self.tool_pipeline = tool_pipeline
        self.upstream = upstream
        self.sessions = McpSessions(self.settings.max_sessions, self.settings.session_idle_s)

    @property
    def code_tools(self) -> dict[str, ToolSettings]:
        return self.services.settings.ingress.tools

    async def list_tools(self, principal: Principal) -> tuple[list[dict[str, Any]], str]:
        """The caller's tools, and whether the upstream's could be read."""
        upstream: list[dict[str, Any]] = []
        state = "none"
        if self.upstream is not None:
            try:
                upstream = await self.upstream.list_tools()
                state = "ok"
            except (UpstreamError, UpstreamRpcError) as exc:
                # The code tools still work; the upstream's come back when it does.
                log.warning("upstream MCP tools/list failed: %s", exc)
                state = "unavailable"
        return visible_tools(self.code_tools, upstream, principal.scopes), state

    async def call_tool(
        self,
        principal: Principal,
        bearer: str,
        source_ip: str,
        params: dict[str, Any],
        progress: ProgressSink | None = None,
    ) -> dict[str, Any]:
        name = params.get("name")
        arguments = params.get("arguments") or {}
        if not isinstance(name, str) or not name:
            raise RpcError(INVALID_PARAMS, "params.name must be a tool name")
        if not isinstance(arguments, dict):
            raise RpcError(INVALID_PARAMS, "params.arguments must be an object")
        tool = self.code_tools.get(name)
        if tool is not None:
            return await self._run_code(tool, name, bearer, source_ip, arguments, progress)
        if self.upstream is None or not may_use_upstream_tool(name, principal.scopes):
            # A tool the caller may not use is as unknown as one that does not exist.
            raise RpcError(INVALID_PARAMS, f"Unknown tool: {name}")
        meta = params.get("_meta")
        token = meta.get(APPROVAL_TOKEN_META) if isinstance(meta, dict) else None
        return await self._forward(principal, bearer, source_ip, name, arguments, token)

    async def _run_code(
        self,
        tool: ToolSettings,
        name: str,
        bearer: str,
        source_ip: str,
        arguments: Any,
        progress: ProgressSink | None = None,
    ) -> dict[str, Any]:
        ctx = ExecContext(
            ingress="mcp",
            source_ip=source_ip,
            bearer=bearer,
            payload=arguments,
            decode=_code_decoder(tool, arguments),
            tool_name=name,
        )
        # Its own task: a caller that goes away stops the progress, not the run.
        run = asyncio.ensure_future(self.pipeline.run(ctx))
        if progress is not None:
            await self._report_progress(ctx, run, progress)
        try:
            await asyncio.shield(run)
        except GatewayError as exc:
            return error_result(exc.body())
        if ctx.held is not None:
            return held_result(held_body(ctx), guarded=False)
        record = await self.services.store.get(ctx.execution_id)
        assert record is not None and record["result"] is not None
        return execution_result(record["result"])

    async def _report_progress(
        self, ctx: ExecContext, run: asyncio.Future[Any], progress: ProgressSink
    ) -> None:
        """Output so far, as progress notifications, while the code runs."""
        running = asyncio.ensure_future(ctx.running.wait())
        try:
            await asyncio.wait({run, running}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            running.cancel()
        live = self.services.live.get(ctx.execution_id) if ctx.running.is_set() else None
        if live is None:
            return
        sent_bytes, tail = 0, ""
        async for batch in live.follow():
            for chunk in batch:
                sent_bytes += len(chunk.text.encode("utf-8"))
                tail = (tail + chunk.text)[-PROGRESS_TAIL_CHARS:]
            if not await progress({"progress": sent_bytes, "message": tail}):
                return

    async def _forward(
        self,
        principal: Principal,
        bearer: str,
        source_ip: str,
        name: str,
        arguments: dict[str, Any],
        approval_token: Any,
    ) -> dict[str, Any]:
        assert self.upstream is not None
        guarded = name in self.settings.guarded_tools
        ctx = ExecContext(
            ingress="mcp",
            source_ip=source_ip,
            # Only the guarded pipeline authenticates (again); unguarded calls need
            # the context for their audit fields alone.
            bearer=bearer if guarded else None,
            payload=arguments,
            decode=lambda _ctx: tool_request(
                arguments, approval_token if isinstance(approval_token, str) else None
            ),
            tool_name=name,
            tool_call={"name": name, "server": "upstream", "arguments": arguments},
        )
        ctx.principal = principal if not guarded else None
        if guarded:
            try:
                await self.tool_pipeline.run(ctx)
            except GatewayError as exc:
                return error_result(exc.body())
            if ctx.held is not None:
                return held_result(held_body(ctx), guarded=True)
        started = time.perf_counter()
        outcome, is_error = "ok", False
        try:
            answer = await self.upstream.call_tool(name, arguments)
            is_error = bool(answer.get("isError"))
            answer.setdefault("content", [])
        except UpstreamRpcError as exc:
            outcome, is_error = "rpc_error", True
            answer = error_result({"error": {"code": "upstream_error", **exc.error}})
        except UpstreamError as exc:
            kind = (
                errors.UPSTREAM_TIMEOUT if exc.reason == "timeout" else errors.UPSTREAM_UNAVAILABLE
            )
            outcome, is_error = kind.code, True
            answer = error_result(GatewayError(kind, str(exc)).body())
        await self.services.audit.append(
            "tool.forwarded",
            **ctx.audit_fields(),
            ingress="mcp",
            source_ip=source_ip,
            tool=name,
            # The arguments may hold secrets: their hash identifies them, never their text.
            arguments_sha256=hashlib.sha256(canonical_arguments(arguments).encode()).hexdigest(),
            guarded=guarded,
            decision_id=ctx.decision.decision_id if ctx.decision else None,
            approval_id=ctx.approval.get("id") if ctx.approval else None,
            outcome=outcome,
            is_error=is_error,
            duration_ms=round((time.perf_counter() - started) * 1000),
        )
        return answer
