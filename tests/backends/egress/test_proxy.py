"""The proxy alone, on the host's loopback: hostile requests and credentials."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from backends.base import Credential
from backends.egress.proxy import EgressProxy, split_host_port
from backends.egress.record import NetworkRecord


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[int, list[bytes]]]:
    heads: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        yield server.sockets[0].getsockname()[1], heads


async def ask(proxy: EgressProxy, request: bytes) -> bytes:
    server = await asyncio.start_server(proxy.handle, "127.0.0.1", 0)
    async with server:
        reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        writer.write(request)
        writer.write_eof()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
    return answer


async def test_credential_replaces_the_codes_own_header(
    upstream: tuple[int, list[bytes]],
) -> None:
    port, heads = upstream
    proxy = EgressProxy(NetworkRecord())
    credential = Credential(f"127.0.0.1:{port}", "Authorization", "Bearer real")
    proxy.arm((f"127.0.0.1:{port}",), (credential,))
    request = (
        f"GET http://127.0.0.1:{port}/x HTTP/1.1\r\nHost: evil\r\n"
        "authorization: Bearer forged\r\nProxy-Authorization: x\r\n\r\n"
    ).encode()
    assert (await ask(proxy, request)).endswith(b"ok")
    head = heads[0].decode()
    assert "Bearer real" in head and "forged" not in head and "Proxy-Authorization" not in head
    assert f"Host: 127.0.0.1:{port}" in head and "evil" not in head


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"\r\n\r\n",
        b"GET /relative HTTP/1.1\r\n\r\n",
        b"GET ftp://127.0.0.1/ HTTP/1.1\r\n\r\n",
        b"CONNECT 127.0.0.1:99999 HTTP/1.1\r\n\r\n",
        b"CONNECT [::1 HTTP/1.1\r\n\r\n",
        b"GET http://127.0.0.1/" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",
        b"\xff\xfe garbage",
    ],
)
async def test_nonsense_is_refused_and_nothing_is_allowed(request_bytes: bytes) -> None:
    record = NetworkRecord()
    proxy = EgressProxy(record)
    proxy.arm(("127.0.0.1:*",), ())
    answer = await ask(proxy, request_bytes)
    assert answer == b"" or answer.split()[1] in (b"400", b"431")
    assert all(a.verdict == "blocked" for a in record.entries)


def test_split_host_port() -> None:
    assert split_host_port("[::1]:443") == ("::1", 443)
    assert split_host_port("example.com:80") == ("example.com", 80)
    assert split_host_port("example.com", 80) == ("example.com", 80)
