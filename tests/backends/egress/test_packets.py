from __future__ import annotations

import ipaddress
import struct

from backends.egress.packets import (
    RST,
    SYN,
    TCP,
    UDP,
    _checksum,
    nxdomain,
    parse,
    parse_dns,
    tcp_reset,
    udp_reply,
)

V4_SRC, V4_DST = (ipaddress.ip_address(a).packed for a in ("100.64.0.2", "192.0.2.9"))
V6_SRC, V6_DST = (ipaddress.ip_address(a).packed for a in ("fd00:ec::2", "2001:db8::7"))


def syn4(dport: int = 4444) -> bytes:
    tcp = struct.pack(">HHIIBBHHH", 40000, dport, 1000, 0, 5 << 4, SYN, 64240, 0, 0)
    ip = struct.pack(">BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 1, 0x4000, 64, TCP, 0, V4_SRC, V4_DST)
    return ip + tcp


def test_ipv4_syn_and_its_reset() -> None:
    packet = parse(syn4())
    assert packet is not None and packet.is_syn
    assert (packet.dst_host, packet.dport, packet.sport) == ("192.0.2.9", 4444, 40000)
    reset = tcp_reset(packet)
    assert _checksum(reset[:20]) == 0  # a valid IPv4 header checksum
    back = parse(reset)
    assert back is not None and back.flags & RST and not back.is_syn
    assert (back.src, back.dst, back.sport, back.dport) == (V4_DST, V4_SRC, 4444, 40000)
    ack = struct.unpack_from(">I", reset, 28)[0]
    assert ack == 1001


def test_ipv6_udp_dns_question_and_answer() -> None:
    question = struct.pack(">HHHHHH", 7, 0x0100, 1, 0, 0, 0)
    question += b"\x0bsecret-data\x05exfil\x04test\x00" + struct.pack(">HH", 1, 1)
    udp = struct.pack(">HHHH", 50000, 53, 8 + len(question), 0) + question
    ip = struct.pack(">IHBB16s16s", 6 << 28, len(udp), UDP, 64, V6_SRC, V6_DST)
    packet = parse(ip + udp)
    assert packet is not None and packet.dst_host == "2001:db8::7" and packet.dport == 53
    parsed = parse_dns(packet.payload)
    assert parsed is not None and parsed.name == "secret-data.exfil.test"
    answer = nxdomain(parsed)
    assert answer[:2] == b"\x00\x07" and answer[3] & 0x0F == 3  # NXDOMAIN
    assert struct.unpack_from(">H", answer, 6)[0] == 0  # no answers
    reply = parse(udp_reply(packet, answer))
    assert reply is not None and reply.payload == answer and reply.dport == 50000


def test_not_parsed() -> None:
    assert parse(b"") is None and parse(b"\x45" + b"\0" * 10) is None
    assert parse_dns(b"\x00\x07\x81\x80" + b"\0" * 8) is None  # a response, not a query
    assert parse_dns(b"\x00\x07\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\xc0\x0c") is None
