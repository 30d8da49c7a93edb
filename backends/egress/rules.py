"""The decision's egress list: `host:port`, port a number or `*`.

The host of an entry is one of:
- a name: exact (`api.example.com`), below a suffix (`*.example.org`: names
  below example.org, not example.org itself) or any name (`*`);
- an IP literal (`10.1.2.3`, `[::1]`) or a CIDR range (`10.0.0.0/8`,
  `[fd00::/8]`): IPv6 in brackets.

Names match only name entries and literals only literal or CIDR entries: a
name entry never lets code ask for an address, and the proxy refuses a name
that resolves to an internal address (addresses.py). Only a literal or CIDR
entry reaches those addresses by the code asking for them, deliberately.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from backends.egress.addresses import Destination, DestinationError, IPNetwork, parse_destination

DEFAULT_DENY = "default-deny"


@dataclass(frozen=True, slots=True)
class Rule:
    text: str
    host: str  # lower case; for a wildcard, the suffix with its leading dot; "" for `*`
    wildcard: bool
    port: int | None  # None: any port
    network: IPNetwork | None = None  # a literal (a /32 or /128) or CIDR entry

    @classmethod
    def parse(cls, text: str) -> Rule:
        if text.startswith("["):
            host, close, rest = text[1:].partition("]")
            sep, port = rest[:1], rest[1:]
            if not close or sep != ":":
                raise ValueError(f"{text!r} is not [address]:port")
        else:
            host, sep, port = text.rpartition(":")
        if not sep or not host:
            raise ValueError(f"{text!r} is not host:port")
        port_value = None if port == "*" else int(port)
        if port_value is not None and not 0 < port_value < 65536:
            raise ValueError(f"{text!r}: port out of range")
        if host == "*":
            return cls(text=text, host="", wildcard=True, port=port_value)
        if "/" in host:
            network = ipaddress.ip_network(host, strict=True)
            return cls(text=text, host=host, wildcard=False, port=port_value, network=network)
        wildcard = host.startswith("*.")
        try:
            dest = parse_destination(host[2:] if wildcard else host)
        except DestinationError as exc:
            raise ValueError(f"{text!r}: {exc}") from None
        if dest.address is not None:
            if wildcard or (text.startswith("[") != (dest.address.version == 6)):
                raise ValueError(f"{text!r}: an IPv6 literal goes in brackets, IPv4 not")
            network = ipaddress.ip_network(dest.address)
            return cls(text=text, host=dest.host, wildcard=False, port=port_value, network=network)
        host = "." + dest.host if wildcard else dest.host
        return cls(text=text, host=host, wildcard=wildcard, port=port_value)

    def matches(self, dest: Destination, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if dest.address is not None:
            return self.network is not None and dest.address in self.network
        if self.network is not None:
            return False
        if self.wildcard:
            # `*.example.com` covers names below example.com, not example.com itself.
            return dest.host.endswith(self.host) and len(dest.host) > len(self.host)
        return dest.host == self.host


def _parsed(text: str) -> Rule | None:
    try:
        return Rule.parse(text)
    except ValueError:
        return None


def normalise_host(host: str) -> str:
    return host.strip().rstrip(".").lower()


class Rules:
    """First matching rule wins; nothing matches an empty list. An entry that is not
    a rule (a policy's obligation is not checked like a request) matches nothing."""

    def __init__(self, egress: Iterable[str] = ()) -> None:
        self.rules = tuple(rule for text in egress if (rule := _parsed(text)) is not None)

    def match(self, host: str | Destination, port: int) -> str | None:
        """The text of the rule that allows host:port, or None."""
        if isinstance(host, str):
            try:
                host = parse_destination(host)
            except DestinationError:
                return None
        for rule in self.rules:
            if rule.matches(host, port):
                return rule.text
        return None
