"""The audit log's file format: canonical JSON, the hash chain, and `verify_file`.

Format (what a third party needs to verify a log without this code):

* The file is UTF-8 JSON Lines. Every line is one JSON object terminated by
  `\\n`; there are no blank lines.
* A record carries `seq` (1, 2, 3, ... with no gaps), `ts` (RFC 3339 UTC with
  microseconds, `2026-11-29T10:00:00.123456Z`), `type`, `request_id`,
  `execution_id`, `tenant`, `subject`, its event fields, `prev_hash` and `hash`.
* Canonical JSON of a record = `json.dumps(record_without_hash, sort_keys=True,
  separators=(",", ":"), ensure_ascii=False, allow_nan=False)` encoded as UTF-8.
  (Keys sorted by code point, no whitespace, non-ASCII kept literally, floats
  as Python's shortest round-trip repr.)
* `hash = sha256(prev_hash.encode("ascii") + b"\\n" + canonical_json).hexdigest()`
  (lowercase hex). `prev_hash` is the previous record's `hash`; the first
  record's `prev_hash` is `GENESIS_HASH`, 64 `"0"` characters.
* The line itself is the canonical JSON of the whole record, `hash` included,
  so the file has exactly one valid byte representation: `verify_file` also
  refuses a line that decodes to the right record but is not byte-identical
  to its canonical form (re-ordered keys, added spaces, duplicate keys).

What the chain proves: every record up to the last one is exactly as written
and in order; an edit, deletion, insertion or reordering anywhere before the
last record breaks it at the first affected record. What it cannot prove on its
own: that records were not cut off at the end, or that someone with write
access did not rewrite the whole chain from some point on. Publishing the last
`hash` elsewhere from time to time (an anchor) closes both gaps.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from os import PathLike
from typing import Any

import orjson

# Readers live in audit.read; re-exported so `audit.chain` is the one public name.
from gateway.audit.read import decode_line, query, tail

__all__ = [
    "GENESIS_HASH",
    "VerifyReport",
    "canonical_json",
    "decode_line",
    "query",
    "record_hash",
    "seal",
    "self_check",
    "tail",
    "verify_file",
]

GENESIS_HASH = "0" * 64
# Fields the writer sets; event fields may not use these names.
RESERVED_FIELDS = frozenset({"seq", "ts", "type", "prev_hash", "hash"})
# Present in every record (None when not applicable to the event).
CONTEXT_FIELDS = ("request_id", "execution_id", "tenant", "subject")
_HEX64 = re.compile(r"[0-9a-f]{64}")


def canonical_json(record: dict[str, Any]) -> bytes:
    """Canonical UTF-8 JSON of `record` (the caller removes `hash` first when hashing).

    The definition is the stdlib call below; `record` holds plain JSON values (the
    writer's come from audit_values.jsonable, a verified line's from decode_line:
    neither lets NaN or Infinity through). orjson writes the very same bytes (keys
    sorted by code point, compact, UTF-8, the same escapes, the same shortest floats)
    several times faster, except for a float under 1e-4, which the stdlib writes as
    `1e-05` and orjson as `0.00001` or `1e-7`: an orjson text with `e-` or `0.0000`
    anywhere (a string may hold them too: then the check merely costs a second
    encoding) is encoded again by the stdlib. What orjson refuses (an integer beyond
    64 bits, a lone surrogate, a non-string key) takes the stdlib, which writes or
    refuses it as it always has. tests/gateway/audit/test_canonical.py compares both."""
    try:
        out = orjson.dumps(record, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        out = b"e-"
    if b"e-" not in out and b"0.0000" not in out:
        return out
    return json.dumps(
        record, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def record_hash(prev_hash: str, record: dict[str, Any]) -> str:
    """SHA-256 hex of `prev_hash`, a newline and the canonical JSON of `record` minus `hash`."""
    body = {k: v for k, v in record.items() if k != "hash"}
    digest = hashlib.sha256(prev_hash.encode("ascii") + b"\n" + canonical_json(body))
    return digest.hexdigest()


def seal(record: dict[str, Any], prev_hash: str) -> tuple[dict[str, Any], bytes]:
    """Set `prev_hash` and `hash` on `record`; return it and its line (with `\\n`)."""
    record["prev_hash"] = prev_hash
    record.pop("hash", None)
    body = canonical_json(record)
    record["hash"] = hashlib.sha256(prev_hash.encode("ascii") + b"\n" + body).hexdigest()
    return record, canonical_json(record) + b"\n"


def shape_problem(record: dict[str, Any]) -> str | None:
    """Why `record` lacks the chain's own fields in the right types, or None."""
    seq = record.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 1:
        return "seq missing or not a positive integer"
    for name in ("ts", "type"):
        if not isinstance(record.get(name), str):
            return f"{name} missing or not a string"
    for name in ("prev_hash", "hash"):
        value = record.get(name)
        if not isinstance(value, str) or not _HEX64.fullmatch(value):
            return f"{name} missing or not 64 lowercase hex digits"
    return None


def self_check(record: dict[str, Any]) -> str | None:
    """Why `record` is not well-formed and self-consistent (its own hash), or None."""
    problem = shape_problem(record)
    if problem is None and record_hash(record["prev_hash"], record) != record["hash"]:
        problem = "hash mismatch: record content was changed"
    return problem


@dataclass(frozen=True, slots=True)
class VerifyReport:
    ok: bool
    records: int  # records proven intact (all of them when ok)
    first_bad_seq: int | None  # the seq the chain expected where it broke
    line: int | None  # 1-based line number of the first bad line
    reason: str
    last_hash: str = GENESIS_HASH  # hash of the last intact record

    def describe(self) -> str:
        if self.ok:
            return f"ok: {self.records} records, chain intact, last hash {self.last_hash}"
        return (
            f"BROKEN at line {self.line} (expected seq {self.first_bad_seq}): {self.reason}; "
            f"{self.records} records before it are intact"
        )


def verify_file(path: str | PathLike[str]) -> VerifyReport:
    """Check the whole chain in `path`; name the first broken record (blocking: use a thread)."""
    prev_hash = GENESIS_HASH
    count = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            problem, record = _line_problem(raw, count + 1, prev_hash)
            if problem is not None:
                return VerifyReport(False, count, count + 1, lineno, problem, prev_hash)
            prev_hash = record["hash"]
            count += 1
    return VerifyReport(True, count, None, None, "ok", prev_hash)


def _line_problem(raw: bytes, expected: int, prev_hash: str) -> tuple[str | None, dict[str, Any]]:
    if not raw.endswith(b"\n"):
        return "truncated line: the last line has no newline (torn write or cut)", {}
    body = raw[:-1]
    if not body:
        return "empty line", {}
    try:
        record = decode_line(body)
    except ValueError as exc:
        return str(exc), {}
    problem = _chain_problem(record, expected, prev_hash)
    if problem is None and canonical_json(record) != body:
        problem = "line is not in canonical form (bytes changed outside the record)"
    return problem, record


def _chain_problem(record: dict[str, Any], expected: int, prev_hash: str) -> str | None:
    problem = shape_problem(record)
    if problem:
        return problem
    seq = record["seq"]
    if seq > expected:
        return f"seq mismatch: expected {expected}, found {seq} (record deleted or moved)"
    if seq < expected:
        return f"seq mismatch: expected {expected}, found {seq} (record inserted or moved)"
    if record["prev_hash"] != prev_hash:
        if expected == 1:
            return "prev_hash of the first record is not the genesis hash"
        return f"prev_hash mismatch: not the hash of seq {expected - 1}"
    if record_hash(prev_hash, record) != record["hash"]:
        return "hash mismatch: record content was changed"
    return None


@dataclass(frozen=True, slots=True)
class ChainPoint:
    """How far a file is proven: its first `offset` bytes hold `records` intact records."""

    offset: int = 0
    records: int = 0
    last_hash: str = GENESIS_HASH


def verify_more(path: str | PathLike[str], point: ChainPoint) -> tuple[VerifyReport, ChainPoint]:
    """Go on verifying a live log from `point`, over complete lines only (blocking).

    For readers beside the writer (the console): the last line may be half written,
    so it is left for next time rather than called a break. The returned point is
    where to resume; after a break it stays at the last intact record.
    """
    offset, count, prev_hash = point.offset, point.records, point.last_hash
    with open(path, "rb") as f:
        f.seek(offset)
        for raw in f:
            if not raw.endswith(b"\n"):
                break
            problem, record = _line_problem(raw, count + 1, prev_hash)
            if problem is not None:
                here = ChainPoint(offset, count, prev_hash)
                return VerifyReport(False, count, count + 1, count + 1, problem, prev_hash), here
            offset, count, prev_hash = offset + len(raw), count + 1, record["hash"]
    return VerifyReport(True, count, None, None, "ok", prev_hash), ChainPoint(
        offset, count, prev_hash
    )
