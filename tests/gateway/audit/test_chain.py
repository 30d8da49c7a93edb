"""verify_file: an intact chain passes; every kind of tampering names the first broken record."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.audit.chain import GENESIS_HASH, canonical_json, record_hash, verify_file
from gateway.audit.log import AuditLog

N = 8


@pytest.fixture
async def log_file(tmp_path: Path) -> Path:
    path = tmp_path / "audit.jsonl"
    audit = AuditLog(path)
    await audit.start()
    for i in range(N):
        await audit.append(
            "execution.finished" if i % 2 else "request.received",
            request_id=f"req_{i}",
            execution_id=f"exe_{i}",
            tenant="acme",
            subject="svc:agent-7",
            status="ok",
            usage={"cpu_ms": 30 + i, "max_rss_kb": 9100, "ratio": 0.25},
            note="caf\u00e9 \u2603",
            tags=["a", "b"],
        )
    await audit.close()
    return path


def read_lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def write_lines(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(lines))


def edit(path: Path, index: int, change: Callable[[dict], None]) -> None:
    lines = read_lines(path)
    record = json.loads(lines[index])
    change(record)
    lines[index] = canonical_json(record) + b"\n"
    write_lines(path, lines)


def test_intact_chain(log_file: Path) -> None:
    report = verify_file(log_file)
    assert report.ok and report.records == N and report.first_bad_seq is None
    assert report.last_hash == json.loads(read_lines(log_file)[-1])["hash"]


def test_empty_file_is_intact(tmp_path: Path) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_bytes(b"")
    assert verify_file(path).ok


def test_documented_recipe_verifies_independently(log_file: Path) -> None:
    """The module docstring's recipe, re-implemented here, agrees with the file."""
    prev = "0" * 64
    for line in read_lines(log_file):
        record = json.loads(line)
        body = {k: v for k, v in record.items() if k != "hash"}
        canonical = json.dumps(
            body, sort_keys=True, separators=(",", ":"), ensure_ascii=False
        ).encode()
        assert record["prev_hash"] == prev
        assert hashlib.sha256(prev.encode() + b"\n" + canonical).hexdigest() == record["hash"]
        prev = record["hash"]


FIELDS = [
    ("seq", 50),
    ("ts", "2020-01-01T00:00:00.000000Z"),
    ("type", "request.received.x"),
    ("request_id", "req_forged"),
    ("execution_id", None),
    ("tenant", "evil"),
    ("subject", "root"),
    ("status", "error"),
    ("usage", {"cpu_ms": 1}),
    ("note", "cafe"),
    ("prev_hash", "f" * 64),
    ("hash", "e" * 64),
    ("extra", "added field"),
]


@pytest.mark.parametrize(("field", "value"), FIELDS, ids=[f for f, _ in FIELDS])
def test_changing_any_field_is_detected(log_file: Path, field: str, value: object) -> None:
    edit(log_file, 4, lambda r: r.__setitem__(field, value))
    report = verify_file(log_file)
    assert not report.ok
    assert (report.first_bad_seq, report.line, report.records) == (5, 5, 4), report


def test_removing_a_field_is_detected(log_file: Path) -> None:
    edit(log_file, 4, lambda r: r.pop("usage"))
    report = verify_file(log_file)
    assert (report.ok, report.first_bad_seq, report.line) == (False, 5, 5)
    assert "hash mismatch" in report.reason


def test_text_edit_in_place_is_detected(log_file: Path) -> None:
    lines = read_lines(log_file)
    lines[2] = lines[2].replace(b'"cpu_ms":32', b'"cpu_ms":1')
    write_lines(log_file, lines)
    report = verify_file(log_file)
    assert (report.first_bad_seq, report.line) == (3, 3)
    assert "hash mismatch" in report.reason


def test_deleted_record(log_file: Path) -> None:
    lines = read_lines(log_file)
    del lines[4]
    write_lines(log_file, lines)
    report = verify_file(log_file)
    assert (report.ok, report.first_bad_seq, report.line) == (False, 5, 5)
    assert "expected 5, found 6" in report.reason and "deleted" in report.reason


def test_deleted_first_record(log_file: Path) -> None:
    write_lines(log_file, read_lines(log_file)[1:])
    report = verify_file(log_file)
    assert (report.first_bad_seq, report.line) == (1, 1)


def test_swapped_records(log_file: Path) -> None:
    lines = read_lines(log_file)
    lines[3], lines[4] = lines[4], lines[3]
    write_lines(log_file, lines)
    report = verify_file(log_file)
    assert (report.first_bad_seq, report.line) == (4, 4)
    assert "expected 4, found 5" in report.reason


def test_duplicated_record_inserted(log_file: Path) -> None:
    lines = read_lines(log_file)
    lines.insert(5, lines[2])
    write_lines(log_file, lines)
    report = verify_file(log_file)
    assert (report.first_bad_seq, report.line) == (6, 6)
    assert "inserted" in report.reason


def test_forged_record_inserted_with_valid_hash(log_file: Path) -> None:
    """A self-consistent forgery chained onto seq 5 breaks the chain at the next line."""
    lines = read_lines(log_file)
    prev = json.loads(lines[4])
    forged = {**prev, "seq": 6, "tenant": "evil", "prev_hash": prev["hash"]}
    forged["hash"] = record_hash(prev["hash"], forged)
    lines.insert(5, canonical_json(forged) + b"\n")
    write_lines(log_file, lines)
    report = verify_file(log_file)
    assert (report.first_bad_seq, report.line) == (7, 7)
    assert "expected 7, found 6" in report.reason


def test_rehashed_edit_breaks_the_next_link(log_file: Path) -> None:
    def change(record: dict) -> None:
        record["tenant"] = "evil"
        record["hash"] = record_hash(record["prev_hash"], record)

    edit(log_file, 4, change)
    report = verify_file(log_file)
    assert (report.first_bad_seq, report.line) == (6, 6)
    assert "prev_hash mismatch" in report.reason


def test_truncated_last_line(log_file: Path) -> None:
    data = log_file.read_bytes()
    log_file.write_bytes(data[:-40])
    report = verify_file(log_file)
    assert (report.ok, report.first_bad_seq, report.line, report.records) == (False, N, N, N - 1)
    assert "truncated" in report.reason


def test_truncated_middle_line(log_file: Path) -> None:
    lines = read_lines(log_file)
    lines[2] = lines[2][:50] + b"\n"
    write_lines(log_file, lines)
    report = verify_file(log_file)
    assert (report.first_bad_seq, report.line) == (3, 3)
    assert "bad JSON" in report.reason


def test_last_record_removed_is_not_detectable_alone(log_file: Path) -> None:
    """Documented limit: cutting whole records off the end needs an external anchor."""
    last_hash = json.loads(read_lines(log_file)[-1])["hash"]
    write_lines(log_file, read_lines(log_file)[:-1])
    report = verify_file(log_file)
    assert report.ok and report.records == N - 1
    assert report.last_hash != last_hash  # a saved anchor would reveal it


@pytest.mark.parametrize(
    ("mangle", "reason"),
    [
        (lambda line: line[:-1] + b" \n", "canonical"),
        (lambda line: line.replace(b'{"', b'{ "', 1), "canonical"),
        (lambda line: b"\n", "empty line"),
        (lambda line: b"\xff" + line, "not UTF-8"),
        (lambda line: b"[1,2]\n", "not an object"),
        (lambda line: line.replace(b'"seq":3', b'"seq":"3"'), "seq missing"),
    ],
    ids=["trailing-space", "inner-space", "blank", "binary", "array", "seq-type"],
)
def test_malformed_lines(log_file: Path, mangle: Callable[[bytes], bytes], reason: str) -> None:
    lines = read_lines(log_file)
    lines[2] = mangle(lines[2])
    write_lines(log_file, lines)
    report = verify_file(log_file)
    assert (report.ok, report.first_bad_seq, report.line) == (False, 3, 3), report
    assert reason in report.reason


def test_duplicate_key_is_not_canonical(log_file: Path) -> None:
    lines = read_lines(log_file)
    lines[2] = lines[2].replace(b'{"', b'{"tenant":"evil","', 1)
    write_lines(log_file, lines)
    report = verify_file(log_file)
    assert (report.first_bad_seq, report.line) == (3, 3)


def test_first_record_must_chain_from_genesis(tmp_path: Path) -> None:
    record = {"seq": 1, "ts": "2026-01-01T00:00:00.000000Z", "type": "x"}
    record["prev_hash"] = "1" * 64
    record["hash"] = record_hash(record["prev_hash"], record)
    path = tmp_path / "audit.jsonl"
    path.write_bytes(canonical_json(record) + b"\n")
    report = verify_file(path)
    assert (report.first_bad_seq, report.line) == (1, 1)
    assert "genesis" in report.reason
    assert GENESIS_HASH == "0" * 64
