"""The decision's egress list: `host:port`, host exact or `*.suffix`, port or `*`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

DEFAULT_DENY = "default-deny"


@dataclass(frozen=True, slots=True)
class Rule:
    text: str
    host: str  # lower case; for a wildcard, the suffix with its leading dot
    wildcard: bool
    port: int | None  # None: any port

    @classmethod
    def parse(cls, text: str) -> Rule:
        host, sep, port = text.rpartition(":")
        if not sep or not host:
            raise ValueError(f"{text!r} is not host:port")
        wildcard = host.startswith("*.")
        host = normalise_host(host[1:] if wildcard else host)
        return cls(text=text, host=host, wildcard=wildcard, port=None if port == "*" else int(port))

    def matches(self, host: str, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        host = normalise_host(host)
        if self.wildcard:
            # `*.example.com` covers names below example.com, not example.com itself.
            return host.endswith(self.host) and len(host) > len(self.host)
        return host == self.host


def normalise_host(host: str) -> str:
    return host.strip().rstrip(".").lower()


class Rules:
    """First matching rule wins; nothing matches an empty list."""

    def __init__(self, egress: Iterable[str] = ()) -> None:
        self.rules = tuple(Rule.parse(text) for text in egress)

    def match(self, host: str, port: int) -> str | None:
        """The text of the rule that allows host:port, or None."""
        for rule in self.rules:
            if rule.matches(host, port):
                return rule.text
        return None
