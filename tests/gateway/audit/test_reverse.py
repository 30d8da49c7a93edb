"""Reading the audit log backwards: block boundaries, long records, torn tails, cursors."""

from __future__ import annotations

import io
import random
from pathlib import Path

import pytest

from gateway.audit.chain import GENESIS_HASH, seal
from gateway.audit.read import AuditFilter, query, query_sync
from gateway.audit.reverse import end_before_seq, lines_newest_first
from tests.gateway.audit.test_read import write_log


def newest_first(data: bytes, block_size: int) -> list[tuple[int, bytes]]:
    return list(lines_newest_first(io.BytesIO(data), block_size=block_size))


def expected(data: bytes) -> list[tuple[int, bytes]]:
    """The forward reading, reversed: complete non-empty lines with their offsets."""
    out, offset = [], 0
    for line in data.split(b"\n")[:-1]:
        if line:
            out.append((offset, line))
        offset += len(line) + 1
    return out[::-1]


@pytest.mark.parametrize("block_size", [1, 2, 3, 5, 7, 16, 64, 4096])
def test_every_block_size_reads_the_same_lines(block_size: int) -> None:
    rng = random.Random(block_size)
    for _ in range(50):
        lines = [b"x" * rng.randrange(0, 40) for _ in range(rng.randrange(0, 12))]
        data = b"\n".join(lines) + (b"\n" if lines and rng.random() < 0.7 else b"")
        assert newest_first(data, block_size) == expected(data), data


def test_a_record_longer_than_many_blocks() -> None:
    long = b"L" * 1000
    data = b"a\n" + long + b"\nb\n"
    assert newest_first(data, 7) == [(1003, b"b"), (2, long), (0, b"a")]
    assert newest_first(long + b"\n", 7) == [(0, long)]


def test_a_torn_last_line_is_not_a_record() -> None:
    # A crash mid-write leaves a final line without its newline, here longer than a block.
    data = b"one\ntwo\n" + b'{"seq":3,"te' * 10
    assert newest_first(data, 4) == [(4, b"two"), (0, b"one")]
    assert newest_first(b"only torn", 4) == []
    assert newest_first(b"", 4) == []
    assert newest_first(b"\n\n", 1) == []


def test_end_bounds_the_scan_and_bytes_after_the_start_are_ignored() -> None:
    data = b"one\ntwo\nthree\n"
    f = io.BytesIO(data)
    lines = lines_newest_first(f, end=8, block_size=3)
    assert next(lines) == (4, b"two")
    f.seek(0, 2)
    f.write(b"four\n")  # appended while reading: not part of this scan
    assert list(lines) == [(0, b"one")]


def _log(path: Path, count: int, pad: int) -> None:
    prev = GENESIS_HASH
    with path.open("wb") as f:
        for seq in range(1, count + 1):
            record = {"seq": seq, "ts": "2026-11-29T10:00:00.000000Z", "type": "t"}
            record["pad"] = "p" * (pad * (seq % 5))
            _, line = seal(record, prev)
            prev = record["hash"]
            f.write(line)


@pytest.mark.parametrize("block_size", [16, 300, 4096])
def test_the_seq_cursor_bound_never_skips_a_record(tmp_path: Path, block_size: int) -> None:
    path = tmp_path / "audit.jsonl"
    _log(path, 200, pad=150)
    data = path.read_bytes()
    with path.open("rb") as f:
        for seq in (1, 2, 57, 100, 199, 200, 201, 10_000):
            end = end_before_seq(f, seq, block_size=block_size)
            before = [n for n in range(1, 201) if n < seq]
            # Everything from `end` on has seq >= the cursor; nothing earlier is cut off.
            assert data[:end].count(b"\n") >= len(before)
            assert end == 0 or data[end - 1 : end] == b"\n"
            got = [
                r["seq"]
                for r in query_sync(path, AuditFilter(before_seq=seq), limit=500, descending=True)
            ]
            assert got == before[::-1]


def test_the_cursor_bound_stops_narrowing_at_a_damaged_line(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    _log(path, 100, pad=10)
    lines = path.read_bytes().split(b"\n")
    lines[50] = b"not json"
    data = b"\n".join(lines)
    path.write_bytes(data)
    line_80 = data.index(b'{"hash"', data.index(b'"seq":79,'))
    with path.open("rb") as f:
        for block_size in (8, 16, 64, 256):
            assert end_before_seq(f, 80, block_size=block_size) >= line_80
    got = query_sync(path, AuditFilter(before_seq=80), limit=500, descending=True)
    assert [r["seq"] for r in got] == [n for n in range(79, 0, -1) if n != 51]


async def test_newest_first_queries_filter_and_page(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    await write_log(path)  # n = 0..11, seq = n + 1

    async def ns(**kwargs: object) -> list[int]:
        return [r["n"] for r in await query(path, descending=True, **kwargs)]  # type: ignore[arg-type]

    assert await ns() == list(range(11, -1, -1))
    assert await ns(limit=3) == [11, 10, 9]
    assert await ns(limit=3, before_seq=10) == [8, 7, 6]
    assert await ns(tenant="acme", limit=2) == [10, 8]
    assert await ns(tenant="acme", limit=2, before_seq=9) == [6, 4]
    assert await ns(type="auth.failed", tenant="globex") == [11, 5]
    assert await ns(execution_id="exe_2", before_seq=9) == [7, 6]
    assert await ns(before_seq=1) == []
    assert await ns(after_seq=9, before_seq=12) == [10, 9]
    records = await query(path)
    assert await ns(since=records[3]["ts"], until=records[5]["ts"]) == [5, 4, 3]
    # `newest` keeps its old meaning: the last records, in seq order.
    assert [r["n"] for r in await query(path, limit=3, newest=True, before_seq=10)] == [6, 7, 8]


async def test_newest_first_skips_a_torn_line_and_a_bad_one(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    await write_log(path, 3)
    with path.open("ab") as f:
        f.write(b"garbage\n")
        f.write(b'{"seq":5,"te')
    assert [r["seq"] for r in await query(path, descending=True)] == [3, 2, 1]
    assert await query(tmp_path / "none.jsonl", descending=True) == []
