"""Live output over real HTTP: `POST /v1/executions` with `Accept: text/event-stream`,
`GET /v1/executions/{id}/events`, against a real gateway (nsjail, embedded Rego, audit).

That output arrives while the program still runs is shown by state, not by timing:
when the first `output` event is in hand, the execution's record says `running`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient

from gateway.settings.model import Settings
from tests.gateway.conftest import audit_records, auth

pytestmark = pytest.mark.integration

Token = Callable[..., str]
STREAM = {"Accept": "text/event-stream"}
# Prints, then sleeps long enough that a record read right after the first event
# is certainly still running, then prints again.
PRINT_SLEEP_PRINT = {
    "language": "python",
    "code": "import time\nprint('first', flush=True)\ntime.sleep(4)\nprint('second')\n",
    "limits": {"timeout_s": 30},
}


async def events(resp: ClientResponse) -> AsyncIterator[tuple[str, Any]]:
    assert resp.status == 200, await resp.text()
    assert resp.headers["Content-Type"].startswith("text/event-stream")
    event, data = "message", []
    async for raw in resp.content:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield event, json.loads("\n".join(data))
            event, data = "message", []
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())


async def _post(client: TestClient, tok: str, body: dict[str, Any], **params: str) -> Any:
    return await client.post(
        "/v1/executions", json=body, headers={**auth(tok), **STREAM}, params=params
    )


async def test_output_arrives_while_the_program_runs_then_the_same_result(
    client: TestClient, token: Token, settings: Settings
) -> None:
    tok = token()
    resp = await _post(client, tok, PRINT_SLEEP_PRINT)
    seen: list[tuple[str, Any]] = []
    async for event, data in events(resp):
        if not seen:
            # The first event is output, and the execution has not ended.
            assert event == "output" and data == {"stream": "stdout", "text": "first\n"}
            ids = [
                r["execution_id"]
                for r in audit_records(settings)
                if r["type"] == "execution.started"
            ]
            record = await client.get(f"/v1/executions/{ids[-1]}", headers=auth(tok))
            assert (await record.json())["status"] == "running"
        seen.append((event, data))
    kinds = [e for e, _ in seen]
    assert kinds[-1] == "result" and kinds.count("result") == 1
    text = "".join(d["text"] for e, d in seen if e == "output")
    result = seen[-1][1]
    assert text == "first\nsecond\n" == result["stdout"], seen
    # Exactly what the non-streaming answer carries: the stored result.
    stored = await client.get(f"/v1/executions/{result['execution_id']}", headers=auth(tok))
    assert (await stored.json())["result"] == result
    # Durable before the result event: the finished record is already in the log.
    finished = [r for r in audit_records(settings) if r["type"] == "execution.finished"]
    assert finished[-1]["execution_id"] == result["execution_id"]


async def test_a_character_is_never_split_across_events(client: TestClient, token: Token) -> None:
    code = (
        "import sys, time\n"
        "for piece in (b'\\xe2', b'\\x82', b'\\xac', b'\\xf0\\x9f', b'\\x98\\x80\\n'):\n"
        "    sys.stdout.buffer.write(piece); sys.stdout.buffer.flush(); time.sleep(0.05)\n"
        "sys.stderr.buffer.write(b'\\xff bad\\n')\n"
    )
    resp = await _post(client, token(), {"language": "python", "code": code})
    got = [(e, d) for e, d in [x async for x in events(resp)]]
    outs = [d for e, d in got if e == "output"]
    stdout = [d["text"] for d in outs if d["stream"] == "stdout"]
    assert "".join(stdout) == "€😀\n" and not any("\ufffd" in t for t in stdout)
    result = got[-1][1]
    assert result["stdout"] == "€😀\n"
    stderr = "".join(d["text"] for d in outs if d["stream"] == "stderr")
    assert stderr == result["stderr"]


async def test_a_flood_stays_capped_on_the_stream(client: TestClient, token: Token) -> None:
    body = {
        "language": "python",
        "code": "import sys\nfor _ in range(100000): sys.stdout.write('x' * 99 + '\\n')\n",
        "limits": {"output_bytes": 65536},
    }
    resp = await _post(client, token(), body)
    got = [x async for x in events(resp)]
    streamed = sum(len(d["text"].encode()) for e, d in got if e == "output")
    result = got[-1][1]
    assert result["status"] == "output_limit" and result["truncated"]["stdout"]
    assert streamed == len(result["stdout"].encode()) <= 65536


async def test_refusals_before_the_run_are_plain_json_errors(
    client: TestClient, token: Token
) -> None:
    resp = await _post(client, token(), {"language": "python"})
    assert resp.status == 400 and resp.content_type == "application/json"
    assert (await resp.json())["error"]["code"] == "invalid_request"
    denied = {"language": "python", "code": "1", "network": {"egress": ["a.example:443"]}}
    resp = await _post(client, token(), denied)
    assert resp.status == 403 and (await resp.json())["error"]["code"] == "policy_denied"
    resp = await _post(client, token(scopes="exec:bash"), {"language": "python", "code": "1"})
    assert resp.status == 403 and (await resp.json())["error"]["code"] == "forbidden"


async def test_a_client_that_leaves_leaves_a_complete_execution(
    client: TestClient, token: Token, settings: Settings
) -> None:
    tok = token()
    resp = await _post(client, tok, PRINT_SLEEP_PRINT)
    async for event, _ in events(resp):
        assert event == "output"
        break
    resp.close()  # gone mid-stream
    execution_id = [
        r["execution_id"] for r in audit_records(settings) if r["type"] == "execution.started"
    ][-1]
    record = await client.get(f"/v1/executions/{execution_id}?wait=60", headers=auth(tok))
    body = await record.json()
    assert body["status"] == "done" and body["result"]["stdout"] == "first\nsecond\n"
    finished = [r for r in audit_records(settings) if r["type"] == "execution.finished"]
    assert finished[-1]["execution_id"] == execution_id and finished[-1]["status"] == "ok"


async def test_follow_a_running_execution_and_replay_a_finished_one(
    client: TestClient, token: Token, settings: Settings
) -> None:
    tok = token()
    plain = asyncio.ensure_future(
        client.post(
            "/v1/executions",
            json=PRINT_SLEEP_PRINT,
            headers=auth(tok),
        )
    )

    async def started() -> str:
        while True:
            ids = [
                r["execution_id"]
                for r in audit_records(settings)
                if r["type"] == "execution.started"
            ]
            if ids:
                return ids[-1]
            await asyncio.sleep(0.05)

    execution_id = await asyncio.wait_for(started(), 60)
    follow = await client.get(
        f"/v1/executions/{execution_id}/events", headers={**auth(tok), **STREAM}
    )
    got = [x async for x in events(follow)]
    assert got[-1][0] == "result"
    assert "".join(d["text"] for e, d in got if e == "output") == "first\nsecond\n"
    answer = await (await plain).json()
    assert got[-1][1] == answer

    # Finished: its output once more, then the result.
    again = await client.get(
        f"/v1/executions/{execution_id}/events", headers={**auth(tok), **STREAM}
    )
    replay = [x async for x in events(again)]
    assert [e for e, _ in replay] == ["output", "result"] and replay[-1][1] == answer

    # Another tenant sees nothing, not even that it exists.
    other = await client.get(
        f"/v1/executions/{execution_id}/events", headers={**auth(token(tenant="globex")), **STREAM}
    )
    assert other.status == 404


async def test_held_then_approved_streams_the_run(client: TestClient, token: Token) -> None:
    tok = token()
    held = await _post(client, tok, {"language": "python", "code": "import ctypes\nprint('ran')"})
    got = [x async for x in events(held)]
    assert [e for e, _ in got] == ["held"]  # no wait asked: the stream ends here
    info = got[0][1]
    assert info["status"] == "pending_approval" and info["approval_id"]

    follow = await client.get(
        f"/v1/executions/{info['execution_id']}/events?wait=60", headers={**auth(tok), **STREAM}
    )
    approver = token(sub="sec-officer", scopes="approvals:read approvals:decide")
    first = await follow.content.readuntil(b"\n\n")
    assert b"event: held" in first
    decided = await client.post(
        f"/v1/approvals/{info['approval_id']}/decision",
        json={"decision": "approve"},
        headers=auth(approver),
    )
    assert decided.status == 200, await decided.text()
    rest = [x async for x in events(follow)]
    assert rest[-1][0] == "result" and rest[-1][1]["stdout"] == "ran\n"
    assert ("output", {"stream": "stdout", "text": "ran\n"}) in rest
