"""MCP over Streamable HTTP, the wire rules: JSON-RPC messages, the two revisions.

- 2025-11-25 (and the earlier handshake revisions): `initialize` opens a session
  named by the `MCP-Session-Id` header; every later request carries it.
- 2026-07-28: stateless; each request carries its protocol version and client
  capabilities in `params._meta`, and the `MCP-Protocol-Version`, `Mcp-Method` and
  (for named methods) `Mcp-Name` headers, which must agree with the body.

Pure functions: classifying a message, checking the headers against the body,
building answers. The HTTP edge is gateway/ingress/mcp.py.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Any

HANDSHAKE_VERSIONS = ("2024-11-05", "2025-03-26", "2025-06-18", "2025-11-25")
MODERN_VERSIONS = ("2026-07-28",)
LATEST_HANDSHAKE = HANDSHAKE_VERSIONS[-1]

VERSION_META = "io.modelcontextprotocol/protocolVersion"
CAPABILITIES_META = "io.modelcontextprotocol/clientCapabilities"
SERVER_INFO_META = "io.modelcontextprotocol/serverInfo"
# Where a caller presents an execgate approval token for a guarded upstream tool.
APPROVAL_TOKEN_META = "execgate/approval_token"

SESSION_HEADER = "Mcp-Session-Id"
VERSION_HEADER = "MCP-Protocol-Version"
METHOD_HEADER = "Mcp-Method"
NAME_HEADER = "Mcp-Name"
# Methods whose subject is mirrored in the Mcp-Name header: method -> params key.
NAME_BEARING = {"tools/call": "name", "prompts/get": "name", "resources/read": "uri"}

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
HEADER_MISMATCH = -32020
UNSUPPORTED_VERSION = -32022
# HTTP status of a modern-revision error (the SDK's table); others are 200.
MODERN_STATUS = {
    PARSE_ERROR: 400,
    INVALID_REQUEST: 400,
    INVALID_PARAMS: 400,
    HEADER_MISMATCH: 400,
    UNSUPPORTED_VERSION: 400,
    METHOD_NOT_FOUND: 404,
}
_B64 = re.compile(r"^=\?base64\?(?P<payload>.*)\?=$")


class RpcError(Exception):
    """A JSON-RPC error answer; `status` is the HTTP status it travels with."""

    def __init__(self, code: int, message: str, *, status: int = 200, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status
        self.data = data


@dataclass(frozen=True, slots=True)
class Message:
    kind: str  # request | notification | response
    id: Any
    method: str | None
    params: dict[str, Any]
    raw: dict[str, Any]

    @property
    def meta(self) -> dict[str, Any]:
        meta = self.params.get("_meta")
        return meta if isinstance(meta, dict) else {}

    @property
    def modern(self) -> bool:
        """A 2026-07-28 message announces its revision in `_meta`."""
        return VERSION_META in self.meta


def parse(body: Any) -> Message:
    """One JSON-RPC message (batches were dropped from MCP in 2025-06-18)."""
    if isinstance(body, list):
        raise RpcError(INVALID_REQUEST, "batches are not supported", status=400)
    if not isinstance(body, dict) or body.get("jsonrpc") != "2.0":
        raise RpcError(INVALID_REQUEST, "not a JSON-RPC 2.0 message", status=400)
    method = body.get("method")
    if method is None and ("result" in body or "error" in body):
        return Message("response", body.get("id"), None, {}, body)
    if not isinstance(method, str):
        raise RpcError(INVALID_REQUEST, "method must be a string", status=400)
    params = body.get("params", {})
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise RpcError(INVALID_PARAMS, "params must be an object", status=400)
    if "id" not in body:
        return Message("notification", None, method, params, body)
    if not isinstance(body["id"], str | int) or isinstance(body["id"], bool):
        raise RpcError(INVALID_REQUEST, "id must be a string or an integer", status=400)
    return Message("request", body["id"], method, params, body)


def decode_header(value: str | None) -> str | None:
    """An Mcp-Name value: verbatim, or `=?base64?...?=` for non-ASCII names."""
    if value is None:
        return None
    match = _B64.fullmatch(value)
    if match is None:
        return value
    payload = match.group("payload")
    try:
        decoded = base64.b64decode(payload, validate=True)
        if base64.b64encode(decoded).decode("ascii") != payload:
            return None
        return decoded.decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def check_modern(msg: Message, headers: dict[str, str]) -> str:
    """The 2026-07-28 envelope and headers; returns the protocol version or raises.

    `headers` maps lower-case names to values (each routing header given once)."""
    meta = msg.meta
    missing = [k for k in (VERSION_META, CAPABILITIES_META) if k not in meta]
    if missing:
        raise RpcError(INVALID_PARAMS, f"params._meta lacks {', '.join(missing)}", status=400)
    version = meta[VERSION_META]
    if version is None or headers.get(VERSION_HEADER.lower()) != version:
        raise RpcError(
            HEADER_MISMATCH, f"{VERSION_HEADER} header does not match the body", status=400
        )
    if headers.get(METHOD_HEADER.lower()) != msg.method:
        raise RpcError(
            HEADER_MISMATCH, f"{METHOD_HEADER} header does not match the body's method", status=400
        )
    name_key = NAME_BEARING.get(msg.method or "")
    if name_key is not None:
        named = msg.params.get(name_key)
        if decode_header(headers.get(NAME_HEADER.lower())) != named:
            raise RpcError(
                HEADER_MISMATCH,
                f"{NAME_HEADER} header does not match the body's {name_key!r}",
                status=400,
            )
    if version not in MODERN_VERSIONS:
        raise RpcError(
            UNSUPPORTED_VERSION,
            "Unsupported protocol version",
            status=400,
            data={"supported": [*MODERN_VERSIONS, *HANDSHAKE_VERSIONS], "requested": version},
        )
    return str(version)


def negotiate(requested: Any) -> str:
    """initialize: the client's revision if we speak it, else our latest."""
    return requested if requested in HANDSHAKE_VERSIONS else LATEST_HANDSHAKE


def result(msg_id: Any, value: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": msg_id, "result": value}


def error(msg_id: Any, exc: RpcError) -> dict[str, Any]:
    body: dict[str, Any] = {"code": exc.code, "message": exc.message}
    if exc.data is not None:
        body["data"] = exc.data
    return {"jsonrpc": "2.0", "id": msg_id, "error": body}
