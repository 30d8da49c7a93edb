"""The guarded-tool pipeline: a call of a non-code tool (an upstream MCP tool named
in `ingress.mcp.guarded_tools`) checked by policy, and held for approval, before the
ingress forwards it. Nothing runs in a sandbox, so there is no admit or dispatch.

The call reaches the policy as `execution.language = "tool"` with its arguments as
canonical JSON in `execution.code` (an approval binds to exactly those arguments)
and a `tool` object (name, server, arguments); see policies/tools.rego.
"""

from __future__ import annotations

import json
from typing import Any

from gateway import errors
from gateway.context import ExecContext
from gateway.errors import GatewayError, invalid_field
from gateway.models import ExecutionRequest
from gateway.services import Services
from gateway.stages.approval import hold_for_approval, redeem_approval
from gateway.stages.auth import authenticate
from gateway.stages.policy import decide
from gateway.stages.policy_input import build_input

TOOL_LANGUAGE = "tool"


def canonical_arguments(arguments: dict[str, Any]) -> str:
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def tool_request(arguments: Any, approval_token: str | None) -> ExecutionRequest:
    if not isinstance(arguments, dict):
        raise invalid_field("arguments", "must be an object")
    return ExecutionRequest(
        language=TOOL_LANGUAGE,
        code=canonical_arguments(arguments),
        approval_token=approval_token,
    )


async def validate_tool(ctx: ExecContext, svc: Services) -> None:
    """The call as a request: size-checked like code, on no backend."""
    if ctx.tool_call is None:
        raise GatewayError(errors.INTERNAL, "not a tool call")
    request = ctx.decode(ctx)
    limit = svc.settings.server.max_code_bytes
    if len(request.code.encode("utf-8")) > limit:
        raise invalid_field("arguments", f"over {limit} bytes")
    ctx.request = request
    ctx.backend = None


TOOL_STAGES = (
    authenticate,  # bearer JWT -> principal
    validate_tool,  # arguments -> a "tool" request
    redeem_approval,  # a presented approval token, bound to these arguments
    build_input,  # the policy input, with its `tool` object
    decide,  # scope tool:<name>, the tenant's tools, approval
    hold_for_approval,  # require_approval -> held for a person
)
