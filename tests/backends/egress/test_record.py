from __future__ import annotations

from backends.egress.record import NetworkRecord


def test_count_cap_and_dropped() -> None:
    record = NetworkRecord(max_entries=3)
    for port in range(10):
        record.add("tcp", "192.0.2.1", port, "blocked", "direct-blocked")
    assert len(record.entries) == 3 and record.dropped == 7


def test_byte_cap_and_long_fields_are_cut() -> None:
    record = NetworkRecord(max_bytes=1000)
    for _ in range(10):
        record.add("dns", "x" * 5000, 53, "blocked", "dns-blocked", "d" * 5000)
    assert all(len(e.host) <= 253 and len(e.detail) <= 200 for e in record.entries)
    assert record.bytes <= 1000 and record.dropped == 10 - len(record.entries)


def test_retransmissions_are_one_attempt() -> None:
    record = NetworkRecord()
    for _ in range(3):
        record.add("tcp", "192.0.2.1", 80, "blocked", "r", key=("tcp", 40000))
    assert len(record.entries) == 1 and record.dropped == 0
