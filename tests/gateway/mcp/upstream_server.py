"""An upstream MCP server built with the official SDK (MCPServer, Streamable HTTP),
served by uvicorn on 127.0.0.1 in a thread of its own. It records the headers of
every HTTP request it receives and every tool call it runs, so tests can prove what
the gateway sends (its own credential) and what it never sends (the caller's token).
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from mcp.server.mcpserver import MCPServer


@dataclass
class UpstreamRecord:
    headers: list[dict[str, str]] = field(default_factory=list)
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)


def build_server(record: UpstreamRecord) -> MCPServer:
    server = MCPServer("upstream-test")

    @server.tool()
    def echo(text: str) -> str:
        """Say it back."""
        record.calls.append(("echo", {"text": text}))
        return f"echo: {text}"

    @server.tool()
    def send_email(to: str, body: str) -> str:
        """Pretend to send an email (a tool a security team guards)."""
        record.calls.append(("send_email", {"to": to, "body": body}))
        return f"sent to {to}"

    @server.tool()
    def lookup_user(user: str) -> str:
        """Read a user's record."""
        record.calls.append(("lookup_user", {"user": user}))
        return f"user {user}: active"

    @server.tool()
    def delete_user(user: str) -> str:
        """Delete a user: the same arguments as lookup_user, another effect."""
        record.calls.append(("delete_user", {"user": user}))
        return f"user {user}: deleted"

    @server.tool()
    def run_python(code: str) -> str:
        """Shadowed by the gateway's own code tool of the same name; never called."""
        record.calls.append(("run_python", {"code": code}))
        return "upstream ran it"

    return server


class _Recording:
    """ASGI middleware: every HTTP request's headers, lower-cased."""

    def __init__(self, app: Any, record: UpstreamRecord) -> None:
        self.app = app
        self.record = record

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            self.record.headers.append(
                {k.decode().lower(): v.decode() for k, v in scope["headers"]}
            )
        await self.app(scope, receive, send)


class UpstreamServer:
    def __init__(self) -> None:
        self.record = UpstreamRecord()
        app = build_server(self.record).streamable_http_app(host="127.0.0.1")
        config = uvicorn.Config(
            _Recording(app, self.record),
            host="127.0.0.1",
            port=0,
            log_level="warning",
            lifespan="on",
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.run(self._server.serve())

    def start(self) -> str:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("upstream MCP server did not start")
            time.sleep(0.02)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/mcp"

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
