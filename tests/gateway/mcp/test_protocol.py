"""The MCP wire rules as pure functions: messages, the 2026-07-28 header checks."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from gateway.mcp.protocol import (
    HEADER_MISMATCH,
    INVALID_PARAMS,
    INVALID_REQUEST,
    UNSUPPORTED_VERSION,
    RpcError,
    check_modern,
    decode_header,
    negotiate,
    parse,
)

MODERN = "2026-07-28"


def _call(name: Any = "run_python", version: Any = MODERN) -> dict[str, Any]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": version,
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": name, "arguments": {}, "_meta": meta},
    }


def _headers(**extra: str) -> dict[str, str]:
    base = {"mcp-protocol-version": MODERN, "mcp-method": "tools/call", "mcp-name": "run_python"}
    return {**base, **extra}


def test_message_kinds() -> None:
    assert parse({"jsonrpc": "2.0", "id": 1, "method": "ping"}).kind == "request"
    assert parse({"jsonrpc": "2.0", "method": "notifications/initialized"}).kind == "notification"
    assert parse({"jsonrpc": "2.0", "id": 1, "result": {}}).kind == "response"
    assert parse(_call()).modern
    assert not parse({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}).modern


@pytest.mark.parametrize(
    "body",
    [
        [{"jsonrpc": "2.0", "id": 1, "method": "ping"}],
        {"id": 1, "method": "ping"},
        {"jsonrpc": "2.0", "id": 1, "method": 5},
        {"jsonrpc": "2.0", "id": True, "method": "ping"},
        {"jsonrpc": "2.0", "id": {"x": 1}, "method": "ping"},
        "ping",
    ],
)
def test_malformed_messages(body: Any) -> None:
    with pytest.raises(RpcError) as exc:
        parse(body)
    assert exc.value.code == INVALID_REQUEST and exc.value.status == 400


def test_params_must_be_an_object() -> None:
    with pytest.raises(RpcError) as exc:
        parse({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": [1]})
    assert exc.value.code == INVALID_PARAMS


def test_modern_headers_agree_with_the_body() -> None:
    assert check_modern(parse(_call()), _headers()) == MODERN


@pytest.mark.parametrize(
    "headers",
    [
        _headers(**{"mcp-method": "tools/list"}),
        _headers(**{"mcp-name": "bash"}),
        _headers(**{"mcp-name": "RUN_PYTHON"}),
        _headers(**{"mcp-protocol-version": "2025-11-25"}),
        {"mcp-protocol-version": MODERN, "mcp-method": "tools/call"},  # no Mcp-Name
        {},
    ],
)
def test_modern_header_mismatch_is_400(headers: dict[str, str]) -> None:
    with pytest.raises(RpcError) as exc:
        check_modern(parse(_call()), headers)
    assert (exc.value.code, exc.value.status) == (HEADER_MISMATCH, 400)


def test_non_ascii_names_travel_base64() -> None:
    name = "résumé_tool"
    encoded = "=?base64?" + base64.b64encode(name.encode()).decode() + "?="
    assert check_modern(parse(_call(name)), _headers(**{"mcp-name": encoded})) == MODERN
    assert decode_header("=?base64?!!!?=") is None
    assert decode_header("plain") == "plain"


def test_unknown_modern_version_names_the_supported_ones() -> None:
    body = _call(version="2099-01-01")
    with pytest.raises(RpcError) as exc:
        check_modern(parse(body), _headers(**{"mcp-protocol-version": "2099-01-01"}))
    assert exc.value.code == UNSUPPORTED_VERSION and MODERN in exc.value.data["supported"]


def test_envelope_keys_required() -> None:
    body = _call()
    del body["params"]["_meta"]["io.modelcontextprotocol/clientCapabilities"]
    with pytest.raises(RpcError) as exc:
        check_modern(parse(body), _headers())
    assert exc.value.code == INVALID_PARAMS


def test_negotiation() -> None:
    assert negotiate("2025-06-18") == "2025-06-18"
    assert negotiate("2031-01-01") == "2025-11-25"
    assert negotiate(None) == "2025-11-25"
