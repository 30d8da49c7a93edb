"""How an ingress's raw payload becomes an ExecutionRequest (the validate stage calls it).

`read_json` is the one way a client's JSON is read (REST, tool calls, MCP, approval
decisions, intercepted proxy bodies): gateway/json_codec.py's rules, as a 400 naming
the field.
"""

from __future__ import annotations

from typing import Any

from gateway.context import ExecContext
from gateway.errors import GatewayError, invalid_field
from gateway.json_codec import JsonError, loads
from gateway.models import ExecutionRequest


def read_json(raw: bytes | str, where: str = "body") -> Any:
    """A client's JSON document; a 400 `invalid_request` naming `where` (or the field)."""
    try:
        return loads(raw, where=where)
    except JsonError as exc:
        raise json_refusal(exc) from None


def json_refusal(exc: JsonError) -> GatewayError:
    return invalid_field(exc.where, exc.reason)


def decode_json_body(ctx: ExecContext) -> ExecutionRequest:
    """A REST body (or a held request): a UTF-8 JSON object validated by ExecutionRequest."""
    raw = ctx.payload
    assert isinstance(raw, bytes)
    data = read_json(raw)
    if not isinstance(data, dict):
        raise invalid_field("body", "must be a JSON object")
    return ExecutionRequest.model_validate(data)
