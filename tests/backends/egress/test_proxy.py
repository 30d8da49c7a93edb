"""The proxy alone, on the host's loopback: hostile requests and credentials."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest

from backends.base import Credential
from backends.egress.addresses import (
    INTERNAL_ADDRESS,
    NONCANONICAL_ADDRESS,
    UNRESOLVED,
    IPAddress,
)
from backends.egress.proxy import EgressProxy, Streams, split_host_port
from backends.egress.record import NetworkRecord
from tests.backends.egress.resolvers import MapResolver, RebindingResolver
from tests.components import missing_component


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


# --- names never lead inside ---------------------------------------------------------


@dataclass
class RecordingConnector:
    """Records each address the proxy connects to; reaches `real_port` on loopback
    instead (so no traffic ever leaves for a documentation address)."""

    real_port: int = 0
    targets: list[tuple[str, int]] = field(default_factory=list)

    async def __call__(self, address: str, port: int) -> Streams:
        self.targets.append((address, port))
        if not self.real_port:
            raise ConnectionRefusedError("the test allows no connection")
        return await asyncio.open_connection("127.0.0.1", self.real_port)


NAMES = {
    "loop.example.test": ("127.0.0.1",),
    "loop6.example.test": ("::1",),
    "mapped.example.test": ("::ffff:127.0.0.1",),
    "metadata.example.test": ("169.254.169.254",),
    "private.example.test": ("10.1.2.3",),
    "cgnat.example.test": ("100.64.0.1",),
    "nat64.example.test": ("64:ff9b::7f00:1",),
    # One public-looking address is not enough: any internal one refuses the name.
    "mixed.example.test": ("192.0.2.10", "127.0.0.1"),
    "public.example.test": ("192.0.2.10", "2001:db8::10"),
}


def requests_for(host: str, port: int) -> list[bytes]:
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return [
        f"CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode(),
        f"GET http://{authority}/x HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode(),
    ]


def status(answer: bytes) -> int:
    return int(answer.split()[1])


@pytest.mark.parametrize("name", [n for n in NAMES if n != "public.example.test"])
@pytest.mark.parametrize("entry", ["{name}:443", "*.example.test:443", "*:*"])
async def test_a_name_never_reaches_an_internal_address(name: str, entry: str) -> None:
    record = NetworkRecord()
    connector = RecordingConnector()
    proxy = EgressProxy(record, MapResolver(NAMES), connector)
    proxy.arm((entry.format(name=name),), ())
    for request in requests_for(name, 443):
        assert status(await ask(proxy, request)) == 403
    assert connector.targets == []
    assert [(a.kind, a.verdict, a.rule) for a in record.entries] == [
        ("connect", "blocked", INTERNAL_ADDRESS),
        ("http", "blocked", INTERNAL_ADDRESS),
    ]
    assert all(a.host == name for a in record.entries)


@pytest.mark.parametrize("host", ["localhost", "LOCALHOST.", "api.localhost"])
async def test_localhost_is_a_name_and_refused_without_a_lookup(host: str) -> None:
    record = NetworkRecord()
    resolver = MapResolver({"localhost": ("192.0.2.1",)})  # even if DNS said otherwise
    connector = RecordingConnector()
    proxy = EgressProxy(record, resolver, connector)
    proxy.arm(("localhost:8080", "*.localhost:8080", "*:*"), ())
    for request in requests_for(host, 8080):
        assert status(await ask(proxy, request)) == 403
    assert resolver.asked == [] and connector.targets == []
    assert {(a.verdict, a.rule) for a in record.entries} == {("blocked", INTERNAL_ADDRESS)}


@pytest.mark.parametrize(
    "host", ["127.1", "2130706433", "0x7f.1", "0x7f000001", "0177.0.0.1", "127.0.1"]
)
async def test_numbers_in_other_forms_are_neither_names_nor_literals(host: str) -> None:
    record = NetworkRecord()
    resolver = MapResolver({})
    connector = RecordingConnector()
    proxy = EgressProxy(record, resolver, connector)
    proxy.arm(("*:*", "127.0.0.0/8:*"), ())
    for request in requests_for(host, 80):
        assert status(await ask(proxy, request)) == 403
    assert resolver.asked == [] and connector.targets == []
    assert {(a.verdict, a.rule) for a in record.entries} == {("blocked", NONCANONICAL_ADDRESS)}


async def test_one_lookup_and_the_vetted_address_is_the_one_connected(
    upstream: tuple[int, list[bytes]],
) -> None:
    port, heads = upstream
    record = NetworkRecord()
    # A rebinding name: public-looking to the check, loopback to any second lookup.
    resolver = RebindingResolver(first="192.0.2.10", then="127.0.0.1")
    connector = RecordingConnector(real_port=port)
    proxy = EgressProxy(record, resolver, connector)
    proxy.arm(("*.example.test:80",), ())
    answer = await ask(proxy, requests_for("rebind.example.test", 80)[1])
    assert answer.endswith(b"ok")
    assert resolver.asked == ["rebind.example.test"]
    assert connector.targets == [("192.0.2.10", 80)]
    assert b"Host: rebind.example.test:80" in heads[0]
    (entry,) = record.entries
    assert (entry.verdict, entry.rule) == ("allowed", "*.example.test:80")
    assert entry.detail == "GET /x (192.0.2.10)"


async def test_connect_tries_only_vetted_addresses() -> None:
    record = NetworkRecord()
    connector = RecordingConnector()
    proxy = EgressProxy(record, MapResolver(NAMES), connector)
    proxy.arm(("public.example.test:443",), ())
    answer = await ask(proxy, requests_for("public.example.test", 443)[0])
    assert status(answer) == 502
    assert connector.targets == [("192.0.2.10", 443), ("2001:db8::10", 443)]


async def test_operator_range_lets_a_name_in(upstream: tuple[int, list[bytes]]) -> None:
    port, heads = upstream
    record = NetworkRecord()
    proxy = EgressProxy(record, MapResolver(NAMES))
    proxy.arm((f"loop.example.test:{port}",), (), internal_allow=("127.0.0.0/8",))
    answer = await ask(proxy, requests_for("loop.example.test", port)[1])
    assert answer.endswith(b"ok") and len(heads) == 1
    (entry,) = record.entries
    assert (entry.verdict, entry.detail) == ("allowed", "GET /x (127.0.0.1)")
    # The range covers only itself: 10.1.2.3 is still refused.
    assert status(await ask(proxy, requests_for("private.example.test", port)[1])) == 403


@pytest.mark.parametrize(
    ("entries", "host", "allowed"),
    [
        (("127.0.0.1:{port}",), "127.0.0.1", True),
        (("127.0.0.0/8:{port}",), "127.0.0.1", True),
        (("127.0.0.0/8:*",), "127.0.0.1", True),
        (("*:*", "*.example.test:{port}"), "127.0.0.1", False),  # names never match literals
        (("127.0.0.1:{port}",), "::ffff:127.0.0.1", False),  # a mapped form is another address
        (("127.0.0.1:{port}",), "127.0.0.2", False),
        (("10.0.0.0/8:{port}",), "127.0.0.1", False),
    ],
)
async def test_literal_entries_are_the_deliberate_way_in(
    upstream: tuple[int, list[bytes]], entries: tuple[str, ...], host: str, allowed: bool
) -> None:
    port, heads = upstream
    entries = tuple(e.format(port=port) for e in entries)
    record = NetworkRecord()
    resolver = MapResolver({})
    proxy = EgressProxy(record, resolver)
    proxy.arm(entries, ())
    for request in requests_for(host, port):
        answer = await ask(proxy, request)
        assert (status(answer) != 403) is allowed, answer
    assert resolver.asked == []
    assert all(a.verdict == ("allowed" if allowed else "blocked") for a in record.entries)
    assert len(heads) == (1 if allowed else 0)  # the GET; the CONNECT tunnels nothing


async def test_ipv6_literal_entry_reaches_ipv6_loopback() -> None:
    heads: list[bytes] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        writer.close()

    try:
        server = await asyncio.start_server(serve, "::1", 0)
    except OSError:
        missing_component("IPv6 loopback (::1) on this host")
    async with server:
        port = server.sockets[0].getsockname()[1]
        proxy = EgressProxy(NetworkRecord(), MapResolver(NAMES))
        proxy.arm((f"[::1]:{port}",), ())
        assert (await ask(proxy, requests_for("::1", port)[1])).endswith(b"ok")
        assert f"Host: [::1]:{port}".encode() in heads[0]
        # The name that resolves there is still refused.
        proxy.arm((f"loop6.example.test:{port}",), ())
        assert status(await ask(proxy, requests_for("loop6.example.test", port)[1])) == 403


async def test_unresolved_and_hung_names_are_answered() -> None:
    class Hung:
        async def resolve(self, name: str, port: int) -> tuple[IPAddress, ...]:
            await asyncio.Event().wait()
            raise AssertionError("unreachable")

    for resolver in (MapResolver({}), Hung()):
        record = NetworkRecord()
        proxy = EgressProxy(record, resolver, RecordingConnector(), resolve_timeout_s=0.2)
        proxy.arm(("*:*",), ())
        assert status(await ask(proxy, requests_for("nowhere.example.test", 80)[0])) == 502
        assert [(a.verdict, a.rule) for a in record.entries] == [("blocked", UNRESOLVED)]
