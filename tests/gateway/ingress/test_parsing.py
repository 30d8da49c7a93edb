"""Every ingress reads JSON one way: a parser bomb or an ambiguous document is a 400
naming the body or the field (never a 500, never a run), and the refusal is audited
where the ingress audits refusals. Real gateway (nsjail, Rego, audit) behind."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway.json_codec import MAX_DEPTH
from tests.gateway.conftest import audit_records, auth

pytestmark = pytest.mark.integration

Token = Callable[..., str]
DEEP = 100_000
MODERN = "2026-07-28"


def nest(levels: int, leaf: bytes = b"1") -> bytes:
    return b"[" * levels + leaf + b"]" * levels


def deep_object(levels: int) -> bytes:
    return b'{"a":' * levels + b"1" + b"}" * levels


def request_with(member: bytes) -> bytes:
    """A valid execution request with one more member (JSON text) spliced in."""
    return b'{"language":"python","code":"print(1)",' + member + b"}"


# Bodies that no reader may take: (name, raw body, the field the 400 names).
BOMBS = [
    ("deep array", nest(DEEP), "body"),
    ("deep object", deep_object(DEEP), "body"),
    ("just over the bound", nest(MAX_DEPTH + 1), "body"),
    ("deep in limits", request_with(b'"limits":' + deep_object(DEEP)), "body"),
    ("deep in files", request_with(b'"files":' + nest(DEEP)), "body"),
    ("deep in network", request_with(b'"network":{"egress":' + nest(5000) + b"}"), "body"),
]
DUPLICATES = [
    ("top level", b'{"language":"python","code":"print(1)","language":"bash"}', "body"),
    (
        "escaped spelling",
        b'{"language":"python","code":"print(1)","\\u006canguage":"bash"}',
        "body",
    ),
    ("nested", request_with(b'"limits":{"pids":8,"pids":64}'), "limits"),
    ("in an array", request_with(b'"files":[{"path":"a","content_b64":"","path":"b"}]'), "files.0"),
]


async def _rest(client: TestClient, tok: str, raw: bytes) -> tuple[int, Any]:
    resp = await client.post("/v1/executions", data=raw, headers=auth(tok))
    return resp.status, await resp.json()


def _rejections(settings: Any) -> list[dict[str, Any]]:
    return [r for r in audit_records(settings) if r["type"] == "request.rejected"]


def _fields(answer: dict[str, Any]) -> list[str]:
    return [f["field"] for f in answer["error"].get("fields", [])]


async def test_rest_refuses_bombs_and_duplicates_by_name_and_audits_them(
    client: TestClient, token: Token, settings: Any
) -> None:
    for name, raw, field in BOMBS + DUPLICATES:
        before = len(_rejections(settings))
        status, answer = await _rest(client, token(), raw)
        assert status == 400, (name, answer)
        assert answer["error"]["code"] == "invalid_request", name
        assert field in _fields(answer), (name, answer)
        rejected = _rejections(settings)
        assert len(rejected) == before + 1 and rejected[-1]["code"] == "invalid_request", name
    assert not [r for r in audit_records(settings) if r["type"] == "execution.finished"]
    status, ok = await _rest(client, token(), request_with(b'"stdin":""'))
    assert status == 200 and ok["stdout"] == "1\n"  # and the gateway keeps serving


INT_LIMITS = ["memory_mb", "pids", "disk_mb", "output_bytes"]
FLOAT_LIMITS = ["timeout_s", "cpus"]


async def test_limits_take_no_coercion(client: TestClient, token: Token) -> None:
    """Every numeric limit, every wrong JSON type; `1.0` is not an integer limit."""
    cases = [(f, v) for f in INT_LIMITS + FLOAT_LIMITS for v in (True, False, "8", "null", [8], {})]
    cases += [(f, v) for f in INT_LIMITS for v in (8.0, 8.5, 1e2)]
    for limit, value in cases:
        body = {"language": "python", "code": "print(1)", "limits": {limit: value}}
        status, answer = await _rest(client, token(), json.dumps(body).encode())
        assert status == 400, (limit, value, answer)
        assert f"limits.{limit}" in _fields(answer), (limit, value, answer)


async def test_strict_fields_elsewhere_and_what_stays_accepted(
    client: TestClient, token: Token
) -> None:
    bad = [
        ({"language": True, "code": "x"}, "language"),
        ({"language": "python", "code": ["x"]}, "code"),
        ({"language": "python", "code": "x", "stdin": 1}, "stdin"),
        ({"language": "python", "code": "x", "files": {"path": "a"}}, "files"),
        ({"language": "python", "code": "x", "network": {"egress": "a.org:443"}}, "network.egress"),
        ({"language": "python", "code": "x", "backend": 1}, "backend"),
    ]
    for body, field in bad:
        status, answer = await _rest(client, token(), json.dumps(body).encode())
        assert status == 400 and field in _fields(answer), (body, answer)
    # An integer is a number: a whole-number float limit stays accepted.
    ok = {"language": "python", "code": "print(1)", "limits": {"timeout_s": 5, "cpus": 1}}
    status, answer = await _rest(client, token(), json.dumps(ok).encode())
    assert status == 200, answer


async def _tool_calls(client: TestClient, tok: str, raw: bytes) -> tuple[int, Any]:
    resp = await client.post("/v1/tool-calls", data=raw, headers=auth(tok))
    return resp.status, await resp.json()


def _chat(arguments: str) -> bytes:
    call = {"id": "call_1", "type": "function", "function": {"name": "run_code"}}
    call["function"]["arguments"] = arguments
    return json.dumps({"role": "assistant", "tool_calls": [call]}).encode()


async def test_tool_calls_refuse_bombs_and_duplicates_in_body_and_argument_strings(
    client: TestClient, token: Token, settings: Any
) -> None:
    for name, raw, _ in BOMBS + DUPLICATES[:1]:
        status, answer = await _tool_calls(client, token(), raw)
        assert status == 400 and answer["error"]["code"] == "invalid_request", name
        assert "body" in _fields(answer), name
    # OpenAI passes arguments as a JSON string: it is read by the same rules.
    inner = [
        ('{"code":"print(1)","language":"python","language":"bash"}', "arguments"),
        ('{"code":"print(1)","code":"print(2)"}', "arguments"),
        (
            '{"code":"print(1)","files":[{"path":"a","path":"b","content_b64":""}]}',
            "arguments.files.0",
        ),
        ('{"code":"print(1)","files":' + nest(DEEP).decode() + "}", "arguments"),
        ('{"code":"print(1)","language":1}', "language"),
    ]
    for arguments, field in inner:
        before = len(_rejections(settings))
        status, answer = await _tool_calls(client, token(), _chat(arguments))
        assert status == 200, answer
        reply = json.loads(answer["messages"][0]["content"])
        assert reply["error"]["code"] == "invalid_request", (arguments, reply)
        assert field in _fields(reply), (arguments, reply)
        assert len(_rejections(settings)) == before + 1, arguments
    anthropic = {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "tu_1", "name": "run_code", "input": {}}],
    }
    raw = (
        json.dumps(anthropic).encode().replace(b'"input": {}', b'"input": {"code":"1","code":"2"}')
    )
    status, answer = await _tool_calls(client, token(), raw)
    assert status == 400 and "content.0.input" in _fields(answer), answer


def _mcp_headers(tok: str) -> dict[str, str]:
    return {
        **auth(tok),
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/call",
        "Mcp-Name": "run_python",
    }


def _mcp_call(arguments: bytes) -> bytes:
    meta = (
        b'{"io.modelcontextprotocol/protocolVersion":"' + MODERN.encode() + b'",'
        b'"io.modelcontextprotocol/clientCapabilities":{}}'
    )
    return (
        b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"run_python",'
        b'"arguments":' + arguments + b',"_meta":' + meta + b"}}"
    )


async def test_mcp_refuses_bombs_and_duplicates_as_parse_errors_and_audits_them(
    client: TestClient, token: Token, settings: Any
) -> None:
    tok = token(scopes="exec:python")
    cases = [
        ("deep body", nest(DEEP)),
        ("deep arguments", _mcp_call(b'{"code":"print(1)","x":' + nest(DEEP) + b"}")),
        ("duplicate arguments", _mcp_call(b'{"code":"print(1)","code":"import os"}')),
        (
            "duplicate method",
            _mcp_call(b"{}").replace(b'"id":1,', b'"id":1,"method":"tools/list",'),
        ),
    ]
    for name, raw in cases:
        before = [r for r in audit_records(settings) if r["type"] == "mcp.rejected"]
        resp = await client.post("/mcp", data=raw, headers=_mcp_headers(tok))
        body = await resp.json()
        assert resp.status == 400 and body["error"]["code"] == -32700, (name, body)
        assert body["error"]["data"][0]["field"].startswith(("body", "params")), (name, body)
        after = [r for r in audit_records(settings) if r["type"] == "mcp.rejected"]
        assert len(after) == len(before) + 1 and after[-1]["rpc_code"] == -32700, name
    # Strict arguments: `code` must be text, not coerced.
    resp = await client.post("/mcp", data=_mcp_call(b'{"code":1}'), headers=_mcp_headers(tok))
    body = await resp.json()
    assert body["result"]["isError"] is True, body
    resp = await client.post(
        "/mcp", data=_mcp_call(b'{"code":"print(1)"}'), headers=_mcp_headers(tok)
    )
    assert (await resp.json())["result"]["structuredContent"]["stdout"] == "1\n"


async def test_approval_decisions_refuse_bombs_duplicates_and_coercion(
    client: TestClient, token: Token
) -> None:
    approver = token(sub="alice", scopes="approvals:decide approvals:read")
    cases = [
        (nest(DEEP), "body"),
        (b'{"decision":"deny","reason":"no","decision":"approve"}', "body"),
        (b'{"decision":"approve","approver":{"name":' + nest(DEEP) + b"}}", "body"),
        (b'{"decision":"approve","reason":1}', "reason"),
        (b'{"decision":true}', "decision"),
    ]
    for raw, field in cases:
        resp = await client.post(
            "/v1/approvals/apr_nosuch/decision", data=raw, headers=auth(approver)
        )
        answer = await resp.json()
        assert resp.status == 400, (raw[:60], answer)
        assert answer["error"]["code"] == "invalid_request" and field in _fields(answer), answer
