"""The boundary recorder: reads the sandbox's default route (a TUN device).

Whatever the code sends past its loopback arrives here, whether it used the
proxy settings, its own sockets or raw syscalls, and stops here: nothing is
forwarded. A TCP SYN is recorded and answered with a reset (the connect fails
at once, so a loop of attempts cannot sit on timeouts), a UDP datagram is
recorded, and a DNS question sent straight to any server is recorded with its
name and answered NXDOMAIN.
"""

from __future__ import annotations

import contextlib
import os

from backends.egress.packets import TCP, UDP, nxdomain, parse, parse_dns, tcp_reset, udp_reply
from backends.egress.record import NetworkRecord

DIRECT = "direct-blocked"  # the rule: nothing leaves except through the proxy
NO_DNS = "dns-blocked"  # names resolve only at the proxy
# Packets handled per wake-up, so a flood cannot hold the event loop.
BATCH = 256
MTU = 65536


class BoundaryRecorder:
    def __init__(self, tun_fd: int, record: NetworkRecord) -> None:
        self.tun_fd = tun_fd
        self.record = record

    def drain(self) -> None:
        """Handle what the device holds (the event loop calls this when readable)."""
        for _ in range(BATCH):
            try:
                data = os.read(self.tun_fd, MTU)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return  # closed under us at the end of the execution
            self.handle(data)

    def handle(self, data: bytes) -> None:
        packet = parse(data)
        if packet is None:
            return
        host = packet.dst_host
        if packet.proto == TCP:
            if not packet.is_syn:
                return
            key = ("tcp", packet.src, packet.sport, packet.dst, packet.dport)
            self.record.add("tcp", host, packet.dport, "blocked", DIRECT, key=key)
            self._send(tcp_reset(packet))
        elif packet.proto == UDP:
            question = parse_dns(packet.payload) if packet.dport == 53 else None
            if question is not None:
                self.record.add("dns", question.name, 53, "blocked", NO_DNS, f"sent to {host}")
                self._send(udp_reply(packet, nxdomain(question)))
            else:
                detail = f"{len(packet.payload)} bytes"
                self.record.add("udp", host, packet.dport, "blocked", DIRECT, detail)

    def _send(self, packet: bytes) -> None:
        # Best effort: a full queue only means the code waits for its timeout.
        with contextlib.suppress(OSError):
            os.write(self.tun_fd, packet)
