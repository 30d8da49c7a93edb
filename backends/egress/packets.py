"""IPv4/IPv6 TCP and UDP packets seen on the boundary, and the few we answer.

Only what recording needs: the destination of a TCP SYN or a UDP datagram,
a TCP reset that makes a direct connect fail at once instead of hanging, and
DNS questions (the name) with a NXDOMAIN answer.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

TCP, UDP = 6, 17
SYN, RST, ACK = 0x02, 0x04, 0x10


@dataclass(frozen=True, slots=True)
class Packet:
    version: int
    proto: int
    src: bytes
    dst: bytes
    sport: int
    dport: int
    seq: int = 0
    flags: int = 0
    payload: bytes = b""

    @property
    def dst_host(self) -> str:
        return str(ipaddress.ip_address(self.dst))

    @property
    def is_syn(self) -> bool:
        return self.proto == TCP and self.flags & (SYN | ACK) == SYN


def parse(data: bytes) -> Packet | None:
    """A TCP or UDP packet's addresses (None for anything else or truncated)."""
    if not data:
        return None
    version = data[0] >> 4
    if version == 4 and len(data) >= 20:
        ihl = (data[0] & 0x0F) * 4
        proto, src, dst, rest = data[9], data[12:16], data[16:20], data[ihl:]
        if struct.unpack_from(">H", data, 6)[0] & 0x1FFF:
            return None  # a later fragment: no ports in it
    elif version == 6 and len(data) >= 40:
        proto, src, dst, rest = data[6], data[8:24], data[24:40], data[40:]
    else:
        return None
    if proto == TCP and len(rest) >= 20:
        sport, dport, seq = struct.unpack_from(">HHI", rest)
        return Packet(version, proto, src, dst, sport, dport, seq=seq, flags=rest[13])
    if proto == UDP and len(rest) >= 8:
        sport, dport = struct.unpack_from(">HH", rest)
        return Packet(version, proto, src, dst, sport, dport, payload=rest[8:])
    return None


def _checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f">{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def _ip_wrap(version: int, proto: int, src: bytes, dst: bytes, segment: bytes) -> bytes:
    """An IP packet around a TCP/UDP segment whose checksum field (at `csum_at`
    of the segment) is filled here from the pseudo-header."""
    if version == 4:
        pseudo = src + dst + struct.pack(">BBH", 0, proto, len(segment))
    else:
        pseudo = src + dst + struct.pack(">IxxxB", len(segment), proto)
    csum_at = 16 if proto == TCP else 6
    csum = _checksum(pseudo + segment)
    if proto == UDP and csum == 0:
        csum = 0xFFFF
    segment = segment[:csum_at] + struct.pack(">H", csum) + segment[csum_at + 2 :]
    if version == 4:
        header = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(segment), 0, 0x4000, 64,
                             proto, 0, src, dst)  # fmt: skip
        header = header[:10] + struct.pack(">H", _checksum(header)) + header[12:]
        return header + segment
    return struct.pack(">IHBB16s16s", 6 << 28, len(segment), proto, 64, src, dst) + segment


def tcp_reset(syn: Packet) -> bytes:
    """The reset a closed port would send: the connect fails with ECONNREFUSED."""
    segment = struct.pack(">HHIIBBHHH", syn.dport, syn.sport, 0, (syn.seq + 1) & 0xFFFFFFFF,
                          5 << 4, RST | ACK, 0, 0, 0)  # fmt: skip
    return _ip_wrap(syn.version, TCP, syn.dst, syn.src, segment)


def udp_reply(to: Packet, payload: bytes) -> bytes:
    segment = struct.pack(">HHHH", to.dport, to.sport, 8 + len(payload), 0) + payload
    return _ip_wrap(to.version, UDP, to.dst, to.src, segment)


@dataclass(frozen=True, slots=True)
class DnsQuestion:
    ident: int
    flags: int
    name: str
    qtype: int
    question: bytes  # the question section as sent


def parse_dns(data: bytes) -> DnsQuestion | None:
    """The first question of a DNS query (None if it is not one)."""
    if len(data) < 12:
        return None
    ident, flags, qdcount = struct.unpack_from(">HHH", data)
    if flags & 0x8000 or qdcount < 1:
        return None
    labels, pos = [], 12
    while pos < len(data) and data[pos]:
        length = data[pos]
        if length & 0xC0 or pos + 1 + length > len(data):
            return None
        labels.append(data[pos + 1 : pos + 1 + length].decode("ascii", errors="replace"))
        pos += 1 + length
    if pos + 5 > len(data):
        return None
    qtype = struct.unpack_from(">H", data, pos + 1)[0]
    return DnsQuestion(ident, flags, ".".join(labels), qtype, data[12 : pos + 5])


def nxdomain(question: DnsQuestion) -> bytes:
    """ "No such name": nothing usable, and nothing to retry."""
    flags = 0x8000 | (question.flags & 0x7900) | 0x0080 | 3  # QR, opcode+RD, RA, NXDOMAIN
    return struct.pack(">HHHHHH", question.ident, flags, 1, 0, 0, 0) + question.question
