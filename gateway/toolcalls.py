"""Tool calls in three protocols, and their replies in the same protocol and ids.

- OpenAI Chat: `tool_calls` (`function` with JSON-string `arguments`, `custom` with a
  raw `input`) -> `role: tool` messages with `tool_call_id`;
- OpenAI Responses: `function_call` / `custom_tool_call` items -> `function_call_output`
  / `custom_tool_call_output` items with `call_id`;
- Anthropic: `tool_use` blocks (object `input`) -> `tool_result` blocks with
  `tool_use_id` and `is_error`.

Pure functions: parsing what a pipeline sends, turning one call's arguments into an
execution request, and rendering outcomes. The HTTP edge is gateway/ingress/toolcalls.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from gateway.json_codec import JsonError, loads
from gateway.models import ExecutionRequest
from gateway.settings.model import ToolSettings

Protocol = Literal["openai_chat", "openai_responses", "anthropic"]
INGRESS = {"openai_chat": "openai", "openai_responses": "openai", "anthropic": "anthropic"}


class ToolCallError(ValueError):
    """The body holds no tool calls we can read; `field` says where."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class ToolCall:
    protocol: Protocol
    id: str
    name: str
    kind: str  # function | custom | function_call | custom_tool_call | tool_use
    arguments: Any  # dict for functions and tool_use, raw text for custom tools


def _openai_chat(calls: Any) -> list[ToolCall]:
    if not isinstance(calls, list):
        raise ToolCallError("tool_calls", "must be a list")
    out = []
    for i, call in enumerate(calls):
        if not isinstance(call, dict) or not isinstance(call.get("id"), str):
            raise ToolCallError(f"tool_calls.{i}", "must be an object with an id")
        kind = call.get("type", "function")
        inner = call.get(kind)
        if kind not in ("function", "custom") or not isinstance(inner, dict):
            raise ToolCallError(f"tool_calls.{i}.type", "must be function or custom")
        args = inner.get("arguments") if kind == "function" else inner.get("input")
        out.append(ToolCall("openai_chat", call["id"], str(inner.get("name", "")), kind, args))
    return out


def _openai_responses(items: list[Any]) -> list[ToolCall]:
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ToolCallError(f"items.{i}", "must be an object")
        kind = item.get("type")
        if kind not in ("function_call", "custom_tool_call"):
            continue  # reasoning, messages... are not ours to answer
        if not isinstance(item.get("call_id"), str):
            raise ToolCallError(f"items.{i}.call_id", "must be a string")
        args = item.get("arguments") if kind == "function_call" else item.get("input")
        out.append(
            ToolCall("openai_responses", item["call_id"], str(item.get("name", "")), kind, args)
        )
    return out


def _anthropic(blocks: list[Any]) -> list[ToolCall]:
    out = []
    for i, block in enumerate(blocks):
        if not isinstance(block, dict) or block.get("type") != "tool_use":
            continue  # text and thinking blocks
        if not isinstance(block.get("id"), str):
            raise ToolCallError(f"content.{i}.id", "must be a string")
        out.append(
            ToolCall(
                "anthropic", block["id"], str(block.get("name", "")), "tool_use", block.get("input")
            )
        )
    return out


def parse(body: Any) -> tuple[Protocol, list[ToolCall]]:
    """Find the tool calls in an assistant message (or a whole model response)."""
    if isinstance(body, dict) and isinstance(body.get("choices"), list) and body["choices"]:
        body = body["choices"][0].get("message", {})  # a whole Chat Completion
    if isinstance(body, dict) and "tool_calls" in body:
        return "openai_chat", _openai_chat(body["tool_calls"])
    if isinstance(body, list):
        body = {"items": body}
    if isinstance(body, dict):
        for key in ("output", "items"):
            if isinstance(body.get(key), list):
                return "openai_responses", _openai_responses(body[key])
        if isinstance(body.get("content"), list):
            return "anthropic", _anthropic(body["content"])
    raise ToolCallError(
        "body", "expected OpenAI tool_calls, Responses output items or Anthropic content blocks"
    )


def to_request(call: ToolCall, tool: ToolSettings) -> ExecutionRequest:
    """The call's arguments as an execution request; raises ToolCallError or ValidationError."""
    args = call.arguments
    if call.kind in ("custom", "custom_tool_call"):
        # A custom tool's input is the program itself.
        if not isinstance(args, str):
            raise ToolCallError("input", "a custom tool's input must be text")
        return ExecutionRequest(language=tool.language or "python", code=args)
    if isinstance(args, str):
        try:
            args = loads(args, where="arguments") if args.strip() else {}
        except JsonError as exc:
            raise ToolCallError(exc.where, exc.reason) from None
    return request_from_arguments(args, tool)


def request_from_arguments(args: Any, tool: ToolSettings) -> ExecutionRequest:
    """Decoded arguments (an object) as an execution request (also used by /mcp)."""
    if not isinstance(args, dict):
        raise ToolCallError("arguments", "must be a JSON object")
    code = args.get(tool.code_arg)
    if not isinstance(code, str):
        raise ToolCallError(f"arguments.{tool.code_arg}", "missing or not a string")
    body: dict[str, Any] = {
        "language": tool.language or args.get(tool.language_arg, "python"),
        "code": code,
    }
    if tool.stdin_arg in args:
        body["stdin"] = args[tool.stdin_arg]
    if tool.files_arg in args:
        body["files"] = args[tool.files_arg]
    return ExecutionRequest.model_validate(body)


def render(protocol: Protocol, replies: list[tuple[ToolCall, dict[str, Any], bool]]) -> Any:
    """Replies in the caller's protocol: (call, content object, is_error) each."""
    if protocol == "openai_chat":
        return {
            "messages": [
                {"role": "tool", "tool_call_id": call.id, "content": json.dumps(content)}
                for call, content, _ in replies
            ]
        }
    if protocol == "openai_responses":
        return {
            "items": [
                {
                    "type": "custom_tool_call_output"
                    if call.kind == "custom_tool_call"
                    else "function_call_output",
                    "call_id": call.id,
                    "output": json.dumps(content),
                }
                for call, content, _ in replies
            ]
        }
    return {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": call.id,
                "content": json.dumps(content),
                "is_error": is_error,
            }
            for call, content, is_error in replies
        ],
    }
