"""/mcp with the official MCP Python SDK as the client (both revisions it speaks), an
upstream MCP server built with the same SDK on 127.0.0.1, and a real gateway behind
(nsjail, embedded Rego, audit log). Raw HTTP where a test needs a malformed request.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from gateway.app import create_app
from gateway.settings.model import Settings
from tests.gateway.conftest import audit_records, auth, make_settings, require_root
from tests.gateway.mcp.upstream_server import UpstreamServer

pytestmark = pytest.mark.integration

Token = Callable[..., str]
MODERN = "2026-07-28"
UPSTREAM_SECRET = "Bearer upstream-secret-of-the-gateway"


@pytest.fixture(scope="module")
def upstream() -> Iterator[tuple[UpstreamServer, str]]:
    server = UpstreamServer()
    url = server.start()
    yield server, url
    server.stop()


@pytest.fixture
def settings(tmp_path: Path, upstream: tuple[UpstreamServer, str]) -> Settings:
    require_root()
    (tmp_path / "upstream.cred").write_text(UPSTREAM_SECRET + "\n")
    mcp = {
        "upstream_url": upstream[1],
        "upstream_auth_value_file": str(tmp_path / "upstream.cred"),
        "guarded_tools": ["send_email", "lookup_user", "delete_user"],
        "allowed_origins": ["https://console.example"],
        "upstream_tools_cache_s": 0,
    }
    # Approvals keep run_held on: a held tool call is not run by the desk (no sandbox).
    return make_settings(tmp_path, EXECGATE_INGRESS_MCP=json.dumps(mcp))


@pytest.fixture
async def client(aiohttp_client: Any, settings: Settings) -> TestClient:
    return await aiohttp_client(create_app(settings))


class Sdk:
    """Open SDK clients against the gateway's /mcp with a bearer token."""

    def __init__(self, client: TestClient) -> None:
        self.url = str(client.make_url("/mcp"))

    def __call__(self, tok: str, mode: str) -> Any:
        return _connect(self.url, tok, mode)


class _connect:
    def __init__(self, url: str, tok: str, mode: str) -> None:
        self.url, self.tok, self.mode = url, tok, mode

    async def __aenter__(self) -> Client:
        self.http = create_mcp_http_client(headers=auth(self.tok))
        await self.http.__aenter__()
        self.client = Client(
            streamable_http_client(self.url, http_client=self.http), mode=self.mode
        )
        return await self.client.__aenter__()

    async def __aexit__(self, *exc: Any) -> None:
        await self.client.__aexit__(*exc)
        await self.http.__aexit__(*exc)


@pytest.fixture
def sdk(client: TestClient) -> Sdk:
    return Sdk(client)


def _said(result: Any) -> dict[str, Any]:
    """What a gateway-made error result tells the model: its text block's JSON. It
    carries no structuredContent, which would not match the tool's outputSchema."""
    assert result.is_error and result.structured_content is None, result
    return json.loads(result.content[0].text)


def _said_raw(body: dict[str, Any]) -> dict[str, Any]:
    result = body["result"]
    assert result["isError"] and "structuredContent" not in result, result
    return json.loads(result["content"][0]["text"])


async def _names(mcp: Client) -> set[str]:
    return {t.name for t in (await mcp.list_tools()).tools}


@pytest.mark.parametrize("mode", ["legacy", MODERN, "auto"])
async def test_sdk_lists_and_calls_code_and_upstream_tools(
    sdk: Sdk, token: Token, upstream: tuple[UpstreamServer, str], settings: Settings, mode: str
) -> None:
    server, _ = upstream
    tok = token(scopes="exec:python tool:echo")
    async with sdk(tok, mode) as mcp:
        assert mcp.protocol_version == ("2025-11-25" if mode == "legacy" else MODERN)
        names = await _names(mcp)
        # Code tools the scopes allow, the upstream tool the scopes allow; not bash
        # (no exec:bash), not send_email (no tool:send_email), and the upstream's
        # run_python is shadowed by the gateway's own.
        assert {"run_python", "execute_python", "run_code", "echo"} <= names
        assert not names & {"bash", "shell", "send_email"}
        tools = {t.name: t for t in (await mcp.list_tools()).tools}
        assert tools["run_python"].output_schema is not None
        assert "code" in tools["run_python"].input_schema["properties"]

        ran = await mcp.call_tool("run_python", {"code": "print(6*7)"})
        assert not ran.is_error
        assert ran.structured_content["stdout"] == "42\n"
        assert json.loads(ran.content[0].text)["exit_code"] == 0
        # What the code tried, as in every ingress (validated against outputSchema by the SDK).
        assert ran.structured_content["network"] == []
        assert ran.structured_content["behaviour"]["capture"] in ("on", "off")
        assert ran.structured_content["behaviour"]["flags"] == []

        # Code policy holds for a person: an error that names the approval and the wait.
        held = await mcp.call_tool("run_python", {"code": "import ctypes"})
        assert held.is_error and _said(held)["status"] == "pending_approval"
        assert "/v1/executions/" in _said(held)["message"]

        failed = await mcp.call_tool(
            "run_code", {"language": "python", "code": "raise SystemExit(3)"}
        )
        assert failed.is_error and failed.structured_content["exit_code"] == 3

        calls_before = len(server.record.calls)
        echoed = await mcp.call_tool("echo", {"text": "hi"})
        assert not echoed.is_error and echoed.content[0].text == "echo: hi"
        assert server.record.calls[calls_before:] == [("echo", {"text": "hi"})]
        assert not [c for c in server.record.calls if c[0] == "run_python"]  # shadowed

        # Code not allowed by scope: a tool error the model can read, not a crash.
        denied = await mcp.call_tool("bash", {"command": "id"})
        assert denied.is_error and _said(denied)["error"]["code"] == "forbidden"

    # The upstream saw the gateway's credential and never the caller's token.
    seen = server.record.headers
    assert seen and all(h.get("authorization") == UPSTREAM_SECRET for h in seen)
    assert not any(tok in v for h in seen for v in h.values())
    records = audit_records(settings)
    kinds = {r["type"] for r in records if r.get("ingress") == "mcp"}
    assert {"mcp.tools_listed", "tool.forwarded"} <= kinds
    forwarded = [r for r in records if r["type"] == "tool.forwarded"][-1]
    assert (forwarded["tool"], forwarded["outcome"], forwarded["guarded"]) == ("echo", "ok", False)
    if mode == "legacy":
        assert {"mcp.session_opened", "mcp.session_closed"} <= kinds
    assert not any(tok in json.dumps(r) for r in records)


async def _approve(client: TestClient, token: Token, approval_id: str) -> dict[str, Any]:
    """globex's security officer approves; the decision's answer (with its token)."""
    approver = token(tenant="globex", sub="sec-officer", scopes="approvals:read approvals:decide")
    resp = await client.post(
        f"/v1/approvals/{approval_id}/decision",
        json={"decision": "approve"},
        headers=auth(approver),
    )
    answer = await resp.json()
    assert resp.status == 200, answer
    return dict(answer)


async def test_guarded_tool_waits_for_approval_then_forwards(
    client: TestClient, sdk: Sdk, token: Token, upstream: tuple[UpstreamServer, str]
) -> None:
    server, _ = upstream
    tok = token(tenant="globex", scopes="tool:send_email tool:echo")
    args = {"to": "cfo@example.com", "body": "wire the money"}
    async with sdk(tok, "legacy") as mcp:
        assert "send_email" in await _names(mcp)
        held = await mcp.call_tool("send_email", args)
        assert held.is_error
        info = _said(held)
        assert info["status"] == "pending_approval" and info["approval_id"] in held.content[0].text
        assert "execgate/approval_token" in info["message"]
        assert ("send_email", args) not in server.record.calls

        grant = (await _approve(client, token, info["approval_id"]))["approval_token"]

        # The token binds to the arguments: other arguments are refused.
        other = await mcp.call_tool(
            "send_email",
            {**args, "to": "attacker@example.com"},
            meta={"execgate/approval_token": grant},
        )
        assert other.is_error
        assert _said(other)["error"]["code"] == "approval_invalid"

        sent = await mcp.call_tool("send_email", args, meta={"execgate/approval_token": grant})
        assert not sent.is_error, sent
        assert server.record.calls[-1] == ("send_email", args)

        # Single use.
        again = await mcp.call_tool("send_email", args, meta={"execgate/approval_token": grant})
        assert again.is_error and _said(again)["error"]["code"] == "approval_invalid"


async def test_a_guarded_tool_approval_redeems_only_that_tool_and_arguments(
    client: TestClient,
    sdk: Sdk,
    token: Token,
    upstream: tuple[UpstreamServer, str],
    settings: Settings,
) -> None:
    """Approved `lookup_user {"user": "42"}` does not redeem for `delete_user` with
    the very same arguments, nor for other arguments; the approved call runs once."""
    server, _ = upstream
    tok = token(tenant="globex", scopes="tool:lookup_user tool:delete_user")
    args = {"user": "42"}
    async with sdk(tok, MODERN) as mcp:
        held = await mcp.call_tool("lookup_user", args)
        info = _said(held)
        assert info["status"] == "pending_approval", held
        decided = await _approve(client, token, info["approval_id"])
        assert decided["tool"] == {"name": "lookup_user", "server": "upstream"}
        grant = {"execgate/approval_token": decided["approval_token"]}

        before = list(server.record.calls)
        for name, arguments, parts in (
            ("delete_user", args, ["tool"]),
            ("lookup_user", {"user": "43"}, ["code"]),
            ("lookup_user", {"user": "42", "all": True}, ["code"]),
            ("delete_user", {"user": "*"}, ["code", "tool"]),
        ):
            refused = await mcp.call_tool(name, arguments, meta=grant)
            error = _said(refused)["error"]
            assert error["code"] == "approval_invalid", (name, error)
            assert error["reason"] == "request_mismatch" and error["mismatch"] == parts
        assert server.record.calls == before  # the upstream saw none of them

        sent = await mcp.call_tool("lookup_user", args, meta=grant)
        assert not sent.is_error, sent
        assert server.record.calls[len(before) :] == [("lookup_user", args)]
        again = await mcp.call_tool("lookup_user", args, meta=grant)
        assert _said(again)["error"]["reason"] == "reused"
    refused_records = [r for r in audit_records(settings) if r["type"] == "approval.refused"]
    assert [r["mismatch"] for r in refused_records if r.get("mismatch")] == [
        ["tool"],
        ["code"],
        ["code"],
        ["code", "tool"],
    ]
    assert all(r["approval_id"] == info["approval_id"] for r in refused_records)


async def test_guarded_tool_denied_by_policy_never_reaches_upstream(
    sdk: Sdk, token: Token, upstream: tuple[UpstreamServer, str], settings: Settings
) -> None:
    server, _ = upstream
    # initech's policy data lists only echo among its tools.
    tok = token(tenant="initech", scopes="tool:*")
    async with sdk(tok, MODERN) as mcp:
        before = len(server.record.calls)
        result = await mcp.call_tool("send_email", {"to": "x@example.com", "body": "b"})
        assert result.is_error
        error = _said(result)["error"]
        assert error["code"] == "policy_denied"
        assert "tool send_email is not allowed for tenant initech" in json.dumps(error)
        assert len(server.record.calls) == before
    decided = [r for r in audit_records(settings) if r["type"] == "policy.decided"][-1]
    assert decided["language"] == "tool" and decided["allow"] is False


async def _raw(
    client: TestClient, body: Any, tok: str | None, **headers: str
) -> tuple[int, dict[str, str], Any]:
    all_headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
    }
    if tok:
        all_headers.update(auth(tok))
    all_headers.update(headers)
    resp = await client.post("/mcp", data=json.dumps(body), headers=all_headers)
    text = await resp.text()
    return resp.status, dict(resp.headers), json.loads(text) if text else None


def _modern(method: str, params: dict[str, Any] | None = None, id_: int = 1) -> dict[str, Any]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    return {
        "jsonrpc": "2.0",
        "id": id_,
        "method": method,
        "params": {**(params or {}), "_meta": meta},
    }


async def test_modern_headers_must_match_the_body(client: TestClient, token: Token) -> None:
    tok = token(scopes="exec:python")
    ok = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/list"}
    status, _, body = await _raw(client, _modern("tools/list"), tok, **ok)
    assert status == 200 and body["result"]["tools"]

    status, _, body = await _raw(
        client, _modern("tools/list"), tok, **{**ok, "Mcp-Method": "tools/call"}
    )
    assert (status, body["error"]["code"]) == (400, -32020)

    call = _modern("tools/call", {"name": "run_python", "arguments": {"code": "print(1)"}})
    hdrs = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": "bash"}
    status, _, body = await _raw(client, call, tok, **hdrs)
    assert (status, body["error"]["code"]) == (400, -32020)
    status, _, body = await _raw(client, call, tok, **{**hdrs, "Mcp-Name": "run_python"})
    assert status == 200 and body["result"]["structuredContent"]["stdout"] == "1\n"

    status, _, body = await _raw(
        client, _modern("tools/list"), tok, **{**ok, "MCP-Protocol-Version": "2025-11-25"}
    )
    assert (status, body["error"]["code"]) == (400, -32020)
    missing = {
        "jsonrpc": "2.0",
        "id": 3,
        "method": "tools/list",
        "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": MODERN}},
    }
    status, _, body = await _raw(client, missing, tok, **ok)
    assert (status, body["error"]["code"]) == (400, -32602)
    future = _modern("tools/list")
    future["params"]["_meta"]["io.modelcontextprotocol/protocolVersion"] = "2099-01-01"
    status, _, body = await _raw(
        client, future, tok, **{**ok, "MCP-Protocol-Version": "2099-01-01"}
    )
    assert (status, body["error"]["code"]) == (400, -32022)
    assert MODERN in body["error"]["data"]["supported"]


async def test_sessions_origin_and_auth(
    client: TestClient, token: Token, settings: Settings
) -> None:
    tok = token(scopes="exec:python")
    init = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    status, headers, body = await _raw(client, init, tok)
    assert status == 200 and body["result"]["protocolVersion"] == "2025-11-25"
    sid = headers["Mcp-Session-Id"]
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}

    assert (await _raw(client, listing, tok))[0] == 400  # no session header
    assert (await _raw(client, listing, tok, **{"Mcp-Session-Id": "nope"}))[0] == 404
    # Another subject cannot use this session, even in the same tenant.
    other = token(sub="someone-else", scopes="exec:python")
    assert (await _raw(client, listing, other, **{"Mcp-Session-Id": sid}))[0] == 404
    status, _, body = await _raw(client, listing, tok, **{"Mcp-Session-Id": sid})
    assert status == 200 and body["result"]["tools"]
    note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await _raw(client, note, tok, **{"Mcp-Session-Id": sid}))[0] == 202

    assert (await client.get("/mcp", headers=auth(tok))).status == 405
    resp = await client.delete("/mcp", headers={**auth(tok), "Mcp-Session-Id": sid})
    assert resp.status == 204
    assert (await _raw(client, listing, tok, **{"Mcp-Session-Id": sid}))[0] == 404

    # Origin: absent is fine (above), the allowlisted one is fine, others are 403.
    assert (await _raw(client, init, tok, Origin="https://console.example"))[0] == 200
    status, _, body = await _raw(client, init, tok, Origin="https://evil.example")
    assert status == 403 and body["error"]["code"] == "forbidden"
    assert (await client.get("/mcp", headers={**auth(tok), "Origin": "http://evil"})).status == 403

    # No token, bad token: 401 with a challenge; batches and junk: 400.
    resp = await client.post("/mcp", data=json.dumps(init))
    assert resp.status == 401 and resp.headers["WWW-Authenticate"].startswith("Bearer")
    assert (await _raw(client, init, "not-a-jwt"))[0] == 401
    assert (await _raw(client, [init], tok))[0] == 400
    resp = await client.post("/mcp", data=b"{nope", headers=auth(tok))
    assert resp.status == 400 and (await resp.json())["error"]["code"] == -32700

    types = [
        (r["type"], r.get("reason")) for r in audit_records(settings) if r.get("ingress") == "mcp"
    ]
    assert ("mcp.rejected", "origin") in types
    assert ("auth.failed", None) in types


async def test_unknown_and_invisible_tools_are_protocol_errors(
    client: TestClient, token: Token
) -> None:
    tok = token(scopes="exec:python")
    hdrs = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": "echo"}
    # echo exists upstream, but this caller lacks tool:echo: as unknown as a missing tool.
    call = _modern("tools/call", {"name": "echo", "arguments": {"text": "x"}})
    status, _, body = await _raw(client, call, tok, **hdrs)
    assert body["error"]["code"] == -32602 and "Unknown tool" in body["error"]["message"]
    bad = _modern("tools/call", {"name": "run_python", "arguments": {"code": 5}})
    hdrs["Mcp-Name"] = "run_python"
    status, _, body = await _raw(client, bad, tok, **hdrs)
    assert status == 200 and body["result"]["isError"]
    assert _said_raw(body)["error"]["code"] == "invalid_request"


async def test_upstream_down_degrades_to_code_tools(
    aiohttp_client: Any, tmp_path: Path, token: Token
) -> None:
    require_root()
    mcp = {"upstream_url": "http://127.0.0.1:9/mcp", "upstream_timeout_s": 5}
    app = create_app(make_settings(tmp_path, EXECGATE_INGRESS_MCP=json.dumps(mcp)))
    client = await aiohttp_client(app)
    tok = token(scopes="exec:python tool:*")
    ok = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/list"}
    status, _, body = await _raw(client, _modern("tools/list"), tok, **ok)
    assert status == 200 and "run_python" in {t["name"] for t in body["result"]["tools"]}
    call = _modern("tools/call", {"name": "echo", "arguments": {}})
    hdrs = {"MCP-Protocol-Version": MODERN, "Mcp-Method": "tools/call", "Mcp-Name": "echo"}
    status, _, body = await _raw(client, call, tok, **hdrs)
    assert body["result"]["isError"]
    assert _said_raw(body)["error"]["code"] == "upstream_unavailable"
