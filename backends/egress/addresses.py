"""What a destination is, and which addresses a name may never lead to.

A destination host is either an IP literal (canonical dotted IPv4, or IPv6)
or a DNS name. Anything in between is refused rather than guessed at: a
host whose last label is a number (`127.1`, `2130706433`, `0x7f.1`,
`0177.0.0.1`) is what C resolvers and URL parsers read as an IPv4 address,
so it is not a name, and not a literal either unless it is the canonical
form; hosts outside the ASCII hostname alphabet (IDN U-labels, percent
escapes, IPv6 zone ids) are refused too, so what is matched against the
allowlist is exactly what is resolved.

Internal addresses (Stripe Smokescreen's rule set, plus the ranges that
embed an IPv4 address in IPv6) are reachable only through a literal or CIDR
entry, or an operator's `[egress] internal_allow` range: a name never
reaches them, however it matched (rules.py, proxy.py).
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from dataclasses import dataclass
from typing import Protocol

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

INTERNAL_ADDRESS = "internal_address"  # rule of a refusal: a name led inside
NONCANONICAL_ADDRESS = "noncanonical_address"  # a number that is not a plain literal
BAD_HOST = "bad_host"  # not a hostname, not a literal
UNRESOLVED = "unresolved"  # the name has no address (or resolution timed out)
RESOLVE_TIMEOUT_S = 5.0

INTERNAL_NETWORKS: tuple[IPNetwork, ...] = tuple(
    ipaddress.ip_network(n)
    for n in (
        "0.0.0.0/8",  # "this network": connecting to 0.0.0.0 reaches the host's loopback
        "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16",  # RFC 1918
        "100.64.0.0/10",  # carrier-grade NAT (RFC 6598)
        "127.0.0.0/8",  # loopback
        "169.254.0.0/16",  # link-local: cloud metadata (169.254.169.254)
        "192.0.0.0/24",  # IETF protocol assignments (RFC 6890)
        "198.18.0.0/15",  # benchmarking (RFC 2544), used inside networks
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, and 255.255.255.255 (broadcast)
        "::/128", "::1/128",  # unspecified, loopback
        "fc00::/7",  # unique local
        "fe80::/10", "fec0::/10",  # link-local, site-local (deprecated)
        "ff00::/8",  # multicast
        "100::/64",  # discard-only (RFC 6666)
        "64:ff9b:1::/48",  # local-use NAT64 (RFC 8215): leads wherever the operator says
    )
)  # fmt: skip
# IPv6 forms that carry an IPv4 address in their last 32 bits: mapped, compatible,
# SIIT-translated, NAT64 (RFC 6052). The IPv4 address decides.
_EMBEDDING_LOW32 = tuple(
    ipaddress.IPv6Network(n) for n in ("::ffff:0:0/96", "::/96", "::ffff:0:0:0/96", "64:ff9b::/96")
)
_LABEL = re.compile(r"^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$")
# What inet_aton and the WHATWG URL parser take as an IPv4 number.
_NUMBER = re.compile(r"^(0x[0-9a-f]*|[0-9]+)$")


class DestinationError(ValueError):
    def __init__(self, rule: str, reason: str) -> None:
        super().__init__(reason)
        self.rule = rule


@dataclass(frozen=True, slots=True)
class Destination:
    host: str  # lower case, no trailing dot; an IPv6 literal without brackets
    address: IPAddress | None = None  # set when the host is an IP literal


def parse_destination(host: str) -> Destination:
    """The host the code asked for, as a literal or a name, or DestinationError."""
    text = host.strip().lower()
    if text.endswith(".") and not text.endswith(".."):
        text = text[:-1]  # the root label: `example.com.` is `example.com`
    if ":" in text:
        if "%" in text:
            raise DestinationError(BAD_HOST, f"{host[:100]!r}: scoped IPv6 addresses are refused")
        try:
            address6 = ipaddress.IPv6Address(text)
        except ValueError:
            raise DestinationError(BAD_HOST, f"{host[:100]!r} is not an IPv6 address") from None
        return Destination(str(address6), address6)
    labels = text.split(".")
    if not text or len(text) > 253 or not all(_LABEL.match(label) for label in labels):
        raise DestinationError(BAD_HOST, f"{host[:100]!r} is not a hostname")
    if _NUMBER.match(labels[-1]):
        try:
            address = ipaddress.IPv4Address(text)
        except ValueError:
            raise DestinationError(
                NONCANONICAL_ADDRESS, f"{host[:100]!r} reads as an IPv4 address in another form"
            ) from None
        return Destination(str(address), address)
    return Destination(text)


def embedded_ipv4(address: ipaddress.IPv6Address) -> tuple[ipaddress.IPv4Address, ...]:
    """IPv4 addresses an IPv6 address leads to or carries (mapped, NAT64, 6to4, Teredo)."""
    found: list[ipaddress.IPv4Address] = []
    if any(address in net for net in _EMBEDDING_LOW32):
        found.append(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
    if address.sixtofour is not None:
        found.append(address.sixtofour)
    if address.teredo is not None:
        found.extend(address.teredo)
    return tuple(found)


def is_internal(address: IPAddress) -> bool:
    if any(address in net for net in INTERNAL_NETWORKS):
        return True
    if isinstance(address, ipaddress.IPv6Address):
        return any(is_internal(inner) for inner in embedded_ipv4(address))
    return False


def is_localhost_name(name: str) -> bool:
    """RFC 6761: `localhost` and names below it are the host itself, whatever DNS says."""
    return name == "localhost" or name.endswith(".localhost")


class NameResolver(Protocol):
    """Resolves a destination name; the proxy asks once per request."""

    async def resolve(self, name: str, port: int) -> tuple[IPAddress, ...]: ...


class SystemResolver:
    """The gateway host's resolver (getaddrinfo on the loop's executor)."""

    async def resolve(self, name: str, port: int) -> tuple[IPAddress, ...]:
        loop = asyncio.get_running_loop()
        infos = await loop.getaddrinfo(name, port, type=socket.SOCK_STREAM)
        found: list[IPAddress] = []
        for family, _, _, _, sockaddr in infos:
            if family not in (socket.AF_INET, socket.AF_INET6):
                continue
            # A link-local answer carries its zone ("fe80::1%eth0"): still fe80::/10.
            address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
            if address not in found:
                found.append(address)
        return tuple(found)


def parse_ranges(ranges: tuple[str, ...]) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(r, strict=True) for r in ranges)
