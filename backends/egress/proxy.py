"""The egress proxy: the only way out of a sandbox, served by the gateway.

It listens on the sandbox's own loopback (boundary.py put the listening socket
in the sandbox's namespace) and speaks just enough HTTP proxying: CONNECT
host:port (HTTPS, or any TCP the client tunnels) and absolute-URI plain HTTP.
Each request is matched against the decision's egress list and recorded,
allowed or not. A tenant's provisioned credential is added to plain-HTTP
requests for its one destination (inside a CONNECT tunnel the proxy sees only
ciphertext, so it adds nothing there), after removing any header of that name
the code sent: the sandbox never holds it.

A name is resolved once, here, and every address it resolved to is vetted
(addresses.py): if any is internal the request is refused, unless the
operator's `internal_allow` ranges cover it. The proxy then connects to the
vetted address itself, so no second lookup can answer differently (DNS
rebinding). An IP literal the code asks for is allowed only by a literal or
CIDR entry (rules.py) and reaches exactly that address.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Protocol
from urllib.parse import urlsplit

from backends.base import Credential
from backends.egress.addresses import (
    INTERNAL_ADDRESS,
    RESOLVE_TIMEOUT_S,
    UNRESOLVED,
    DestinationError,
    IPAddress,
    IPNetwork,
    NameResolver,
    SystemResolver,
    is_internal,
    is_localhost_name,
    parse_destination,
    parse_ranges,
)
from backends.egress.record import NetworkRecord
from backends.egress.rules import DEFAULT_DENY, Rules, normalise_host

Streams = tuple[asyncio.StreamReader, asyncio.StreamWriter]

MAX_HEAD_BYTES = 16 * 1024
HEAD_TIMEOUT_S = 10.0
UPSTREAM_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 64
# Vetted addresses tried in turn (each within UPSTREAM_TIMEOUT_S) before giving up.
MAX_ADDRESSES = 4
CHUNK = 64 * 1024
# Never forwarded: they concern this hop (RFC 9110 section 7.6.1) or the proxy.
HOP_HEADERS = frozenset(
    {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "te", "trailer",
     "upgrade"}
)  # fmt: skip


class ProxyRefusal(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


def split_host_port(target: str, default_port: int | None = None) -> tuple[str, int]:
    if target.startswith("["):
        host, _, rest = target[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port_text = target.rpartition(":") if ":" in target else (target, "", "")
    if not port_text and default_port is not None:
        return host, default_port
    if not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ProxyRefusal(400, f"bad destination {target[:100]!r}")
    return host, int(port_text)


class Connector(Protocol):
    """Opens the upstream connection to a vetted address (a literal: no lookup)."""

    async def __call__(self, address: str, port: int) -> Streams: ...


async def open_upstream(address: str, port: int) -> Streams:
    return await asyncio.open_connection(address, port)


class EgressProxy:
    def __init__(
        self,
        record: NetworkRecord,
        resolver: NameResolver | None = None,
        connect: Connector = open_upstream,
        resolve_timeout_s: float = RESOLVE_TIMEOUT_S,
    ) -> None:
        self.record = record
        self.resolver = resolver or SystemResolver()
        self.connect = connect
        self.resolve_timeout_s = resolve_timeout_s
        self.rules = Rules()
        self.credentials: tuple[Credential, ...] = ()
        self.internal_allow: tuple[IPNetwork, ...] = ()
        self._writers: set[asyncio.StreamWriter] = set()

    def arm(
        self,
        egress: tuple[str, ...],
        credentials: tuple[Credential, ...],
        internal_allow: tuple[str, ...] = (),
    ) -> None:
        self.rules = Rules(egress)
        self.credentials = credentials
        self.internal_allow = parse_ranges(internal_allow)

    def close_all(self) -> None:
        for writer in list(self._writers):
            writer.close()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._writers) >= MAX_CONNECTIONS:
            writer.close()
            return
        self._writers.add(writer)
        try:
            await self._serve(reader, writer)
        except ProxyRefusal as refusal:
            with contextlib.suppress(OSError):
                await _respond(writer, refusal.status, str(refusal))
        except (OSError, EOFError, TimeoutError, asyncio.IncompleteReadError, ValueError):
            pass  # the code went away or spoke nonsense: nothing to answer
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(HEAD_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            raise ProxyRefusal(431, "request head too large") from None
        if len(head) > MAX_HEAD_BYTES:
            raise ProxyRefusal(431, "request head too large")
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, target, _version = request_line.split(" ", 2)
        headers = [tuple(line.split(":", 1)) for line in header_lines if ":" in line]
        if method == "CONNECT":
            host, port = split_host_port(target)
            kind, detail, path = "connect", "", ""
        else:
            url = urlsplit(target)
            if url.scheme != "http" or not url.hostname:
                raise ProxyRefusal(400, "only absolute http:// URLs and CONNECT are proxied")
            host, port = url.hostname, url.port or 80
            path = (url.path or "/") + (f"?{url.query}" if url.query else "")
            kind, detail = "http", f"{method} {path}"
        try:
            dest = parse_destination(host)
        except DestinationError as exc:
            self.record.add(kind, normalise_host(host), port, "blocked", exc.rule, detail)
            raise ProxyRefusal(403, f"egress to {host[:100]}:{port} refused: {exc}") from None
        host = dest.host
        rule = self.rules.match(dest, port)
        if rule is None:
            self.record.add(kind, host, port, "blocked", DEFAULT_DENY, detail)
            raise ProxyRefusal(403, f"egress to {host}:{port} is not allowed by policy")
        if dest.address is not None:
            addresses: tuple[IPAddress, ...] = (dest.address,)  # a literal entry allowed it
        else:
            addresses = await self._vetted(kind, host, port, detail)
            detail = f"{detail} ({', '.join(map(str, addresses))})".lstrip()
        self.record.add(kind, host, port, "allowed", rule, detail)
        up_reader, up_writer = await self._open(addresses, host, port)
        try:
            if method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            else:
                up_writer.write(self._origin_head(method, path, host, port, headers))
            await asyncio.gather(_pump(reader, up_writer), _pump(up_reader, writer))
        finally:
            up_writer.close()

    async def _vetted(self, kind: str, host: str, port: int, detail: str) -> tuple[IPAddress, ...]:
        """The name's addresses, resolved once; refused if any is internal."""
        addresses: tuple[IPAddress, ...] = ()
        problem = ""
        if not is_localhost_name(host):
            try:
                async with asyncio.timeout(self.resolve_timeout_s):
                    addresses = await self.resolver.resolve(host, port)
            except (OSError, TimeoutError, ValueError, UnicodeError) as exc:
                problem = type(exc).__name__
            if not addresses:
                self.record.add(kind, host, port, "blocked", UNRESOLVED,
                                f"{detail} ({problem or 'no address'})".lstrip())  # fmt: skip
                raise ProxyRefusal(502, f"cannot resolve {host}: {problem or 'no address'}")
        inside = [a for a in addresses if is_internal(a) and not self._operator_allows(a)]
        if is_localhost_name(host) or inside:
            what = ", ".join(map(str, inside)) or "localhost"
            self.record.add(kind, host, port, "blocked", INTERNAL_ADDRESS,
                            f"{detail} ({what})".lstrip())  # fmt: skip
            raise ProxyRefusal(
                403, f"egress to {host}:{port} refused: the name leads to an internal address"
            )
        return addresses

    def _operator_allows(self, address: IPAddress) -> bool:
        return any(address in net for net in self.internal_allow)

    async def _open(self, addresses: tuple[IPAddress, ...], host: str, port: int) -> Streams:
        """Connect to the first vetted address that answers (never to a new lookup)."""
        problem = "no address"
        for address in addresses[:MAX_ADDRESSES]:
            try:
                async with asyncio.timeout(UPSTREAM_TIMEOUT_S):
                    return await self.connect(str(address), port)
            except (OSError, TimeoutError) as exc:
                problem = type(exc).__name__
        raise ProxyRefusal(502, f"cannot reach {host}:{port}: {problem}")

    def _origin_head(
        self, method: str, path: str, host: str, port: int, headers: list[tuple[str, ...]]
    ) -> bytes:
        credential = next(
            (c for c in self.credentials if normalise_host(c.destination) == f"{host}:{port}"),
            None,
        )
        drop = set(HOP_HEADERS) | {"host"}
        if credential is not None:
            drop.add(credential.header.lower())
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        lines = [f"{method} {path} HTTP/1.1", f"Host: {authority}"]
        lines += [f"{k}:{v}" for k, v in headers if k.strip().lower() not in drop]
        if credential is not None:
            lines.append(f"{credential.header}: {credential.value}")
        lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(CHUNK):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except OSError:
        writer.close()


async def _respond(writer: asyncio.StreamWriter, status: int, reason: str) -> None:
    body = f"execgate egress proxy: {reason}\n".encode()
    writer.write(
        f"HTTP/1.1 {status} {'Forbidden' if status == 403 else 'Refused'}\r\n"
        f"Content-Type: text/plain\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        .encode() + body
    )  # fmt: skip
    await writer.drain()
