"""The tools /mcp offers: code tools (from `ingress.tools`) described with input and
output schemas, upstream tools filtered by scope, and tool results in MCP's shape.

Who may see and call what:
- a code tool with a fixed language needs scope `exec:<language>`; one whose
  language is an argument needs at least one `exec:*` scope (the pipeline then
  checks the language actually asked for);
- an upstream tool needs scope `tool:<name>` or `tool:*`, and a code tool's name
  shadows an upstream tool of the same name (the upstream one is never offered).
"""

from __future__ import annotations

import json
from typing import Any

from gateway.settings.model import ToolSettings

RESULT_KEYS = (
    "execution_id",
    "status",
    "exit_code",
    "stdout",
    "stderr",
    "truncated",
    "duration_ms",
    "files",
    "network",
    "behaviour",
)

OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "execution_id": {"type": "string"},
        "status": {
            "type": "string",
            "enum": ["ok", "error", "timeout", "oom", "killed", "output_limit"],
        },
        "exit_code": {"type": ["integer", "null"]},
        "stdout": {"type": "string"},
        "stderr": {"type": "string"},
        "truncated": {
            "type": "object",
            "properties": {"stdout": {"type": "boolean"}, "stderr": {"type": "boolean"}},
        },
        "duration_ms": {"type": "integer"},
        "files": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "size": {"type": "integer"},
                    "content_b64": {"type": "string"},
                },
            },
        },
    },
    "required": ["execution_id", "status", "exit_code", "stdout", "stderr"],
}
_ATTEMPTS = {"type": "array", "items": {"type": "object"}}
OUTPUT_SCHEMA["properties"]["network"] = {
    **_ATTEMPTS,
    "description": "What the code tried on the network, and what the gateway did",
}
OUTPUT_SCHEMA["properties"]["behaviour"] = {
    "type": "object",
    "description": "What the code tried beyond the network (files, programs, signals,"
    " refused system calls) and what the policy's review flagged",
    "properties": {
        "capture": {"type": "string", "enum": ["on", "off"]},
        "reason": {"type": "string"},
        "files": _ATTEMPTS,
        "programs": _ATTEMPTS,
        "signals": _ATTEMPTS,
        "syscalls_refused": {"type": "object", "additionalProperties": {"type": "integer"}},
        "dropped": {"type": "integer"},
        "flags": _ATTEMPTS,
    },
}

_FILES_SCHEMA = {
    "type": "array",
    "description": "Input files placed in the workspace",
    "items": {
        "type": "object",
        "properties": {"path": {"type": "string"}, "content_b64": {"type": "string"}},
        "required": ["path", "content_b64"],
    },
}


def code_tool(name: str, tool: ToolSettings) -> dict[str, Any]:
    """One code tool as an MCP Tool object."""
    what = f"{tool.language} code" if tool.language else "code"
    properties: dict[str, Any] = {
        tool.code_arg: {"type": "string", "description": f"The {what} to run"}
    }
    if not tool.language:
        properties[tool.language_arg] = {
            "type": "string",
            "description": "Language: python, bash or javascript",
        }
    properties[tool.stdin_arg] = {"type": "string", "description": "Standard input"}
    properties[tool.files_arg] = _FILES_SCHEMA
    return {
        "name": name,
        "description": f"Run {what} in a fresh sandbox, under policy (execgate)",
        "inputSchema": {"type": "object", "properties": properties, "required": [tool.code_arg]},
        "outputSchema": OUTPUT_SCHEMA,
    }


def may_use_code_tool(tool: ToolSettings, scopes: frozenset[str]) -> bool:
    if tool.language:
        return f"exec:{tool.language}" in scopes
    return any(s.startswith("exec:") for s in scopes)


def may_use_upstream_tool(name: str, scopes: frozenset[str]) -> bool:
    return f"tool:{name}" in scopes or "tool:*" in scopes


def visible_tools(
    code_tools: dict[str, ToolSettings],
    upstream: list[dict[str, Any]],
    scopes: frozenset[str],
) -> list[dict[str, Any]]:
    offered = [code_tool(n, t) for n, t in code_tools.items() if may_use_code_tool(t, scopes)]
    offered += [
        t
        for t in upstream
        if t["name"] not in code_tools and may_use_upstream_tool(str(t["name"]), scopes)
    ]
    return offered


def ran_result(content: dict[str, Any], is_error: bool) -> dict[str, Any]:
    """A CallToolResult for code that ran: the structured value (it matches
    OUTPUT_SCHEMA) plus the same value as a text block."""
    return {
        "content": [{"type": "text", "text": json.dumps(content)}],
        "structuredContent": content,
        "isError": is_error,
    }


def error_result(content: dict[str, Any]) -> dict[str, Any]:
    """A CallToolResult for anything but a run (held, refused, upstream down).

    It carries no `structuredContent`: a value that is not the declared output would
    break clients that validate it against `outputSchema` (the TypeScript SDK does,
    error results included), and an upstream tool's schema is not ours to fill. The
    model reads what happened from the text block, which is the same JSON."""
    return {"content": [{"type": "text", "text": json.dumps(content)}], "isError": True}


def execution_result(record: dict[str, Any]) -> dict[str, Any]:
    content = {k: record[k] for k in RESULT_KEYS if k in record}
    return ran_result(content, record["status"] != "ok")


def held_result(held: dict[str, Any], guarded: bool) -> dict[str, Any]:
    """A pending approval: not a result yet, so an error the model can read and act on."""
    if guarded:
        how = (
            "Once a person approves, call the tool again with the same arguments and the "
            "approval token (the approver receives it) in params._meta"
            "['execgate/approval_token']; GET /v1/approvals/"
            f"{held['approval_id']} shows the approval's state."
        )
    else:
        how = (
            "Once a person approves, the gateway runs it; await the result with "
            f"GET /v1/executions/{held['execution_id']}?wait=60."
        )
    return error_result(
        {**held, "message": f"Held for human approval ({held['approval_id']}). {how}"}
    )
