"""The sandbox's resolver (its resolv.conf names it): records, answers nothing.

Code that honours the proxy settings never needs a name resolved: the proxy
resolves on the gateway's side. So every question is recorded (a name can
carry data out: `secret-data.exfil.test`) and answered NXDOMAIN.
"""

from __future__ import annotations

import asyncio
from typing import cast

from backends.egress.packets import nxdomain, parse_dns
from backends.egress.record import NetworkRecord
from backends.egress.recorder import NO_DNS


class Resolver(asyncio.DatagramProtocol):
    def __init__(self, record: NetworkRecord) -> None:
        self.record = record
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        question = parse_dns(data)
        if question is None or self.transport is None:
            return
        self.record.add("dns", question.name, 53, "blocked", NO_DNS, f"qtype {question.qtype}")
        self.transport.sendto(nxdomain(question), addr)
