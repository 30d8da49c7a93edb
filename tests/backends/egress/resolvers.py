"""Resolvers the tests control (the network rule: no name reaches real DNS)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from backends.egress.addresses import IPAddress


@dataclass
class MapResolver:
    """Fixed answers per name; a name it does not know has no address."""

    names: dict[str, tuple[str, ...]]
    asked: list[str] = field(default_factory=list)

    async def resolve(self, name: str, port: int) -> tuple[IPAddress, ...]:
        self.asked.append(name)
        return tuple(ipaddress.ip_address(a) for a in self.names.get(name, ()))


@dataclass
class RebindingResolver:
    """Answers `first` to the first question and `then` to every later one."""

    first: str
    then: str
    asked: list[str] = field(default_factory=list)

    async def resolve(self, name: str, port: int) -> tuple[IPAddress, ...]:
        self.asked.append(name)
        return (ipaddress.ip_address(self.first if len(self.asked) == 1 else self.then),)
