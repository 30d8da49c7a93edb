"""The upstream MCP server behind /mcp: a small Streamable HTTP client of our own.

It speaks the 2025-11-25 handshake revision (what MCP servers serve today), keeps
one session (re-opened when the server forgets it), reads answers sent as JSON or
as an SSE stream, and authenticates with the gateway's own configured credential;
nothing of the caller (token, headers) is ever sent upstream.
"""

from __future__ import annotations

import asyncio
import time
from itertools import count
from typing import Any

import aiohttp

from gateway.json_codec import loads
from gateway.mcp.protocol import LATEST_HANDSHAKE, SESSION_HEADER, VERSION_HEADER
from gateway.settings.ingress import McpSettings

MAX_PAGES = 20
MAX_ANSWER_BYTES = 16 * 1024 * 1024


class UpstreamError(Exception):
    """The upstream could not answer: `reason` is unavailable, timeout or protocol."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class UpstreamRpcError(Exception):
    """The upstream answered with a JSON-RPC error."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(str(error.get("message", "error")))
        self.error = error


class Upstream:
    def __init__(self, settings: McpSettings, credential: str | None) -> None:
        self.settings = settings
        self.url = settings.upstream_url
        self._credential = credential
        self._http: aiohttp.ClientSession | None = None
        self._session_id: str | None = None
        self._version = LATEST_HANDSHAKE
        self._lock = asyncio.Lock()
        self._ids = count(1)
        self._tools: list[dict[str, Any]] | None = None
        self._tools_at = 0.0

    async def start(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.settings.upstream_timeout_s)
        # No cookies, no proxies from the environment: only what is configured.
        self._http = aiohttp.ClientSession(
            timeout=timeout, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False
        )

    async def close(self) -> None:
        if self._http is not None:
            if self._session_id is not None:
                try:
                    # Courtesy only: a dead upstream must not hold up shutdown.
                    quick = aiohttp.ClientTimeout(total=2)
                    async with self._http.delete(self.url, headers=self._headers(), timeout=quick):
                        pass
                except (aiohttp.ClientError, OSError, TimeoutError):
                    pass
            await self._http.close()

    def _headers(self) -> dict[str, str]:
        headers = {
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            VERSION_HEADER: self._version,
        }
        if self._session_id is not None:
            headers[SESSION_HEADER] = self._session_id
        if self._credential:
            headers[self.settings.upstream_auth_header] = self._credential
        return headers

    async def _post(self, message: dict[str, Any]) -> tuple[int, dict[str, Any] | None, str | None]:
        """POST one message: (status, the answer to it or None, session id header)."""
        assert self._http is not None
        try:
            async with self._http.post(self.url, json=message, headers=self._headers()) as resp:
                session = resp.headers.get(SESSION_HEADER)
                if resp.status == 202 or "id" not in message:
                    return resp.status, None, session
                if resp.status >= 400:
                    return resp.status, None, session
                kind = resp.content_type
                if kind == "text/event-stream":
                    return resp.status, await _answer_from_sse(resp, message["id"]), session
                body = await resp.content.read(MAX_ANSWER_BYTES + 1)
                if len(body) > MAX_ANSWER_BYTES:
                    raise UpstreamError("protocol", "upstream answer too large")
                return resp.status, loads(body, where="upstream answer"), session
        except TimeoutError:
            raise UpstreamError("timeout", "upstream MCP server timed out") from None
        except (aiohttp.ClientError, OSError) as exc:
            raise UpstreamError("unavailable", f"upstream MCP server unreachable: {exc}") from None
        except ValueError as exc:
            raise UpstreamError("protocol", f"upstream answer is not JSON: {exc}") from None

    async def _open(self) -> None:
        self._session_id = None
        self._version = LATEST_HANDSHAKE
        init = {
            "jsonrpc": "2.0",
            "id": next(self._ids),
            "method": "initialize",
            "params": {
                "protocolVersion": LATEST_HANDSHAKE,
                "capabilities": {},
                "clientInfo": {"name": "execgate", "version": "1"},
            },
        }
        status, answer, session = await self._post(init)
        if status >= 400 or answer is None or "result" not in answer:
            raise UpstreamError("protocol", f"upstream refused initialize (HTTP {status})")
        self._version = str(answer["result"].get("protocolVersion", LATEST_HANDSHAKE))
        self._session_id = session
        await self._post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """One request; a forgotten session (404) is re-opened once."""
        for attempt in range(2):
            async with self._lock:
                if self._session_id is None or attempt:
                    await self._open()
            message = {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params}
            status, answer, _ = await self._post(message)
            if status == 404 and attempt == 0:
                continue
            if status >= 400 or answer is None:
                raise UpstreamError("protocol", f"upstream answered HTTP {status} to {method}")
            if "error" in answer:
                raise UpstreamRpcError(answer["error"] if isinstance(answer["error"], dict) else {})
            result = answer.get("result")
            if not isinstance(result, dict):
                raise UpstreamError("protocol", f"upstream {method} result is not an object")
            return result
        raise AssertionError("unreachable")

    async def list_tools(self) -> list[dict[str, Any]]:
        """The upstream's tools, cached for `upstream_tools_cache_s`."""
        now = time.monotonic()
        if self._tools is not None and now - self._tools_at < self.settings.upstream_tools_cache_s:
            return self._tools
        tools: list[dict[str, Any]] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            page = await self.request("tools/list", {"cursor": cursor} if cursor else {})
            tools += [t for t in page.get("tools", []) if isinstance(t, dict) and "name" in t]
            cursor = page.get("nextCursor")
            if not cursor:
                break
        self._tools, self._tools_at = tools, now
        return tools

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        return await self.request("tools/call", {"name": name, "arguments": arguments})


async def _answer_from_sse(resp: aiohttp.ClientResponse, msg_id: Any) -> dict[str, Any] | None:
    """Read SSE events until the JSON-RPC answer to `msg_id` (skipping notifications)."""
    data: list[str] = []
    seen = 0
    async for raw in resp.content:
        seen += len(raw)
        if seen > MAX_ANSWER_BYTES:
            raise UpstreamError("protocol", "upstream answer too large")
        line = raw.decode("utf-8").rstrip("\r\n")
        if line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
        elif not line and data:
            event = loads("\n".join(data), where="upstream event")
            data = []
            if isinstance(event, dict) and event.get("id") == msg_id and "method" not in event:
                return event
    return None
