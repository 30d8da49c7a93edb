"""An HTTP/1.1 upstream written on raw asyncio streams, for proxy tests that must see
exactly what arrives on the wire: every byte of every connection, and each request as
a strict parser (Content-Length or chunked, nothing lenient) frames it, including
whatever follows on the same keep-alive connection.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field


@dataclass
class WireRequest:
    connection: int
    method: str
    target: str
    headers: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k.lower() == name.lower()]
        assert len(values) <= 1, f"{name} sent {len(values)} times"
        return values[0] if values else None

    def names(self) -> set[str]:
        return {k.lower() for k, _ in self.headers}


@dataclass
class WireUpstream:
    """Answers each request with JSON {"target", "bytes"}; a target containing
    "early" is answered as soon as its headers arrive (its body is read after, as
    servers that answer before reading do), one containing "short" promises more
    bytes than it sends and hangs up; `answer_headers` join every answer."""

    answer_headers: list[tuple[str, str]] = field(default_factory=list)
    raw: list[bytearray] = field(default_factory=list)
    requests: list[WireRequest] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def targets(self) -> list[str]:
        return [r.target for r in self.requests]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        index = len(self.raw)
        self.raw.append(bytearray())
        wire = _Recorded(reader, self.raw[index])
        try:
            while await self._one(index, wire, writer):
                pass
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except ValueError as exc:
            self.errors.append(f"connection {index}: {exc}")
        finally:
            writer.close()

    async def _one(self, index: int, wire: _Recorded, writer: asyncio.StreamWriter) -> bool:
        head = await wire.readuntil(b"\r\n\r\n")
        if not head:
            return False
        line, *lines = head[:-4].decode("latin-1").split("\r\n")
        method, target, _version = line.split(" ")
        headers = []
        for raw in lines:
            name, sep, value = raw.partition(":")
            if not sep or name != name.strip() or raw[:1] in (" ", "\t"):
                raise ValueError(f"malformed header line {raw!r}")
            headers.append((name, value.strip()))
        request = WireRequest(index, method, target, headers, b"")
        te, cl = request.header("Transfer-Encoding"), request.header("Content-Length")
        if te is not None and cl is not None:
            raise ValueError("Transfer-Encoding with Content-Length")
        early = "early" in target
        if early:
            self.requests.append(request)
            await self._answer(writer, request)
        if te is not None:
            if te.lower() != "chunked":
                raise ValueError(f"Transfer-Encoding {te!r}")
            request.body = await self._chunked(wire)
        elif cl is not None:
            request.body = await wire.readexactly(int(cl))
        if not early:
            self.requests.append(request)
            await self._answer(writer, request)
        return True

    @staticmethod
    async def _chunked(wire: _Recorded) -> bytes:
        body = bytearray()
        while True:
            size = int((await wire.readuntil(b"\r\n"))[:-2].split(b";")[0], 16)
            if size == 0:
                await wire.readuntil(b"\r\n")  # no trailers are sent by the gateway
                return bytes(body)
            body += await wire.readexactly(size)
            if await wire.readexactly(2) != b"\r\n":
                raise ValueError("chunk without CRLF")

    async def _answer(self, writer: asyncio.StreamWriter, request: WireRequest) -> None:
        body = json.dumps({"target": request.target, "bytes": len(request.body)}).encode()
        head = ["HTTP/1.1 200 OK", "Content-Type: application/json"]
        head += [f"{k}: {v}" for k, v in self.answer_headers]
        short = "short" in request.target
        head.append(f"Content-Length: {len(body) + 100 if short else len(body)}")
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        await writer.drain()
        if short:
            raise ConnectionResetError("hung up mid-answer, as the test asked")


class _Recorded:
    """A StreamReader that keeps a copy of every byte read."""

    def __init__(self, reader: asyncio.StreamReader, into: bytearray) -> None:
        self._reader, self._into = reader, into

    async def readuntil(self, sep: bytes) -> bytes:
        try:
            data = await self._reader.readuntil(sep)
        except asyncio.IncompleteReadError as exc:
            self._into += exc.partial
            if not exc.partial:
                return b""
            raise
        self._into += data
        return data

    async def readexactly(self, n: int) -> bytes:
        data = await self._reader.readexactly(n)
        self._into += data
        return data


async def raw_exchange(port: int, data: bytes, wait_s: float = 30.0) -> bytes:
    """Send bytes to 127.0.0.1:port as a client would and read the whole answer
    (the gateway closes, or the answer's Content-Length is met)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), wait_s)
        length = 0
        for line in head.decode("latin-1").split("\r\n"):
            if line.lower().startswith("content-length:"):
                length = int(line.split(":", 1)[1])
        body = await asyncio.wait_for(reader.readexactly(length), wait_s)
        return head + body
    finally:
        writer.close()


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])
