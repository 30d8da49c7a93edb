"""How an ingress's raw payload becomes an ExecutionRequest (the validate stage calls it)."""

from __future__ import annotations

import json

from gateway.context import ExecContext
from gateway.errors import invalid_field
from gateway.models import ExecutionRequest


def decode_json_body(ctx: ExecContext) -> ExecutionRequest:
    """A REST body (or a held request): a UTF-8 JSON object validated by ExecutionRequest."""
    raw = ctx.payload
    assert isinstance(raw, bytes)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid_field("body", f"not UTF-8 at byte {exc.start}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise invalid_field("body", f"malformed JSON: {exc}") from None
    if not isinstance(data, dict):
        raise invalid_field("body", "must be a JSON object")
    return ExecutionRequest.model_validate(data)
