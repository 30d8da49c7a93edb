"""POST /v1/tool-calls with payloads built from the openai and anthropic SDKs' own
types, and replies parsed with them; a real gateway (nsjail, Rego, audit) behind."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from anthropic.types import Message, ToolResultBlockParam, ToolUseBlock
from openai.types.chat import (
    ChatCompletionMessage,
    ChatCompletionMessageCustomToolCall,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionToolMessageParam,
)
from openai.types.responses import ResponseCustomToolCall, ResponseFunctionToolCall
from openai.types.responses.response_input_item_param import FunctionCallOutput
from pydantic import TypeAdapter

from tests.gateway.conftest import audit_records, auth

pytestmark = pytest.mark.integration

Token = Callable[..., str]


async def send(client: TestClient, tok: str, body: Any) -> tuple[int, Any]:
    resp = await client.post("/v1/tool-calls", data=json.dumps(body), headers=auth(tok))
    return resp.status, await resp.json()


async def test_openai_chat_function_and_custom_calls_run_concurrently(
    client: TestClient, token: Token
) -> None:
    message = ChatCompletionMessage(
        role="assistant",
        content=None,
        tool_calls=[
            ChatCompletionMessageFunctionToolCall(
                id="call_py",
                type="function",
                function={"name": "run_python", "arguments": json.dumps({"code": "print(6*7)"})},
            ),
            ChatCompletionMessageFunctionToolCall(
                id="call_sh",
                type="function",
                function={"name": "bash", "arguments": json.dumps({"command": "echo hi; exit 2"})},
            ),
            ChatCompletionMessageCustomToolCall(
                id="call_custom",
                type="custom",
                custom={"name": "execute_python", "input": "print('raw')"},
            ),
            ChatCompletionMessageFunctionToolCall(
                id="call_bad",
                type="function",
                function={"name": "run_python", "arguments": "{not json"},
            ),
            ChatCompletionMessageFunctionToolCall(
                id="call_other",
                type="function",
                function={"name": "get_weather", "arguments": "{}"},
            ),
        ],
    )
    status, body = await send(client, token(), message.model_dump(exclude_none=True))
    assert status == 200, body
    adapter = TypeAdapter(ChatCompletionToolMessageParam)
    replies = {m["tool_call_id"]: m for m in body["messages"]}
    assert list(replies) == ["call_py", "call_sh", "call_custom", "call_bad", "call_other"]
    for reply in replies.values():
        adapter.validate_python(reply)
        assert reply["role"] == "tool"
    py = json.loads(replies["call_py"]["content"])
    assert (py["status"], py["stdout"]) == ("ok", "42\n")
    sh = json.loads(replies["call_sh"]["content"])
    assert (sh["status"], sh["exit_code"], sh["stdout"]) == ("error", 2, "hi\n")
    assert json.loads(replies["call_custom"]["content"])["stdout"] == "raw\n"
    bad = json.loads(replies["call_bad"]["content"])["error"]
    assert bad["code"] == "invalid_request" and "JSON" in bad["message"]
    assert json.loads(replies["call_other"]["content"])["error"]["code"] == "unknown_tool"


async def test_openai_responses_items(client: TestClient, token: Token) -> None:
    items = [
        {"type": "reasoning", "id": "rs_1", "summary": []},
        ResponseFunctionToolCall(
            type="function_call",
            call_id="fc_1",
            name="run_code",
            arguments=json.dumps({"language": "javascript", "code": "console.log(1+1)"}),
        ).model_dump(exclude_none=True),
        ResponseCustomToolCall(
            type="custom_tool_call",
            call_id="ct_1",
            name="run_python",
            input="print(3)",
        ).model_dump(exclude_none=True),
    ]
    status, body = await send(client, token(), {"output": items})
    assert status == 200, body
    first, second = body["items"]
    TypeAdapter(FunctionCallOutput).validate_python(first)
    assert first["call_id"] == "fc_1" and json.loads(first["output"])["stdout"] == "2\n"
    assert second["type"] == "custom_tool_call_output" and second["call_id"] == "ct_1"
    assert json.loads(second["output"])["stdout"] == "3\n"


async def test_anthropic_tool_use_denial_and_hold(
    client: TestClient, token: Token, settings: Any
) -> None:
    message = Message(
        id="msg_1",
        type="message",
        role="assistant",
        model="claude",
        stop_reason="tool_use",
        usage={"input_tokens": 1, "output_tokens": 1},
        content=[
            {"type": "text", "text": "let me run that"},
            ToolUseBlock(
                type="tool_use", id="tu_ok", name="run_python", input={"code": "print('ok')"}
            ),
            ToolUseBlock(
                type="tool_use",
                id="tu_code",
                name="run_code",
                input={"language": "python", "code": "print(1)"},
            ),
            ToolUseBlock(
                type="tool_use", id="tu_native", name="run_python", input={"code": "import ctypes"}
            ),
        ],
    )
    body = message.model_dump(exclude_none=True)
    status, answer = await send(client, token(scopes="exec:python"), body)
    assert status == 200, answer
    assert answer["role"] == "user"
    adapter = TypeAdapter(ToolResultBlockParam)
    results = {b["tool_use_id"]: b for b in answer["content"]}
    for block in results.values():
        adapter.validate_python(block)
    assert results["tu_ok"]["is_error"] is False
    ok = json.loads(results["tu_ok"]["content"])
    assert ok["stdout"] == "ok\n"
    assert ok["network"] == [] and ok["behaviour"]["flags"] == []  # as in every ingress
    held = json.loads(results["tu_native"]["content"])
    assert held["status"] == "pending_approval" and held["approval_id"].startswith("apr_")
    assert "GET /v1/executions/" in held["message"]
    types = {r["type"] for r in audit_records(settings)}
    assert {"policy.decided", "approval.requested", "execution.finished"} <= types
    ingresses = {
        r.get("ingress") for r in audit_records(settings) if r["type"] == "request.rejected"
    }
    assert ingresses <= {"anthropic", None}


async def test_anthropic_denial_is_a_tool_error(client: TestClient, token: Token) -> None:
    block = ToolUseBlock(type="tool_use", id="tu_1", name="bash", input={"command": "echo"})
    status, answer = await send(
        client, token(scopes="exec:python"), {"content": [block.model_dump()]}
    )
    assert status == 200
    (result,) = answer["content"]
    assert result["is_error"] is True
    assert json.loads(result["content"])["error"]["code"] == "forbidden"


async def test_bad_requests(client: TestClient, token: Token) -> None:
    assert (await client.post("/v1/tool-calls", data="{}")).status == 401
    status, body = await send(client, token(), {"nothing": []})
    assert status == 400 and body["error"]["fields"][0]["field"] == "body"
    status, body = await send(client, token(), {"tool_calls": "x"})
    assert status == 400 and body["error"]["fields"][0]["field"] == "tool_calls"
    resp = await client.post("/v1/tool-calls", data=b"\xff", headers=auth(token()))
    assert resp.status == 400
