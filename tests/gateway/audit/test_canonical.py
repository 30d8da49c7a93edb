"""The audit log's canonical JSON is unchanged by orjson: the bytes are the documented
stdlib call's, for every value an audit record can hold, and a log written the old way
verifies (and one written now verifies by the documented recipe)."""

from __future__ import annotations

import hashlib
import json
import math
import random
import struct
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.audit.chain import GENESIS_HASH, canonical_json, decode_line, verify_file
from gateway.audit.log import AuditLog


def stdlib_canonical(record: Any) -> bytes:
    """The definition, as gateway/audit/chain.py documents it and old logs were written."""
    return json.dumps(
        record, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


CORPUS: list[Any] = [
    {"note": "caf\u00e9 \u2603 \U0001f600 \u2028\u2029 \x7f"},
    {"escapes": '"\\/\b\f\n\r\t\x00\x01\x1f'},
    {"\u00e9": 1, "e": 2, "Z": 3, "a": 4, "\U0001f600": 5, "\uffff": 6, "": 7, "aa": 8},
    {"floats": [0.0, -0.0, 0.1, 1 / 3, 1e-4, 9.9e-5, 1e-5, 1e-7, 5e-324, 1e15, 1e16, 1e22]},
    {"more floats": [1.7976931348623157e308, 123456789012345.67, 2.5, -1e-320, 4.35]},
    {"ints": [0, -1, 2**53 + 1, 2**63 - 1, -(2**63), 2**63, 2**64 - 1, 2**64, -(2**63) - 1]},
    {"big": 10**40, "neg": -(10**30)},
    {"nested": {"b": {"d": [1, {"z": None, "y": True}], "c": False}, "a": []}},
    {"deep": [[[[[[[[[[{"k": "v"}]]]]]]]]]]},
    {"empty": {}, "list": [], "str": "", "none": None},
    {"seq": 1, "ts": "2026-12-01T10:00:00.123456Z", "type": "execution.finished"},
]


@pytest.mark.parametrize("record", CORPUS, ids=range(len(CORPUS)))
def test_corpus_bytes_are_the_stdlib_definition(record: Any) -> None:
    assert canonical_json(record) == stdlib_canonical(record)


def test_random_floats_keep_their_bytes() -> None:
    rng = random.Random(19)
    floats = [
        struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0] for _ in range(50_000)
    ]
    floats += [rng.uniform(-1, 1) * 10 ** rng.uniform(-8, 20) for _ in range(50_000)]
    floats = [f for f in floats if math.isfinite(f)]
    assert canonical_json({"f": floats}) == stdlib_canonical({"f": floats})
    for f in floats[:5000]:
        assert canonical_json({"f": f}) == stdlib_canonical({"f": f}), repr(f)


_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(), _json_values, max_size=6))
def test_any_record_keeps_its_bytes(record: dict[str, Any]) -> None:
    try:
        expected = stdlib_canonical(record)
    except UnicodeEncodeError:  # lone surrogates: refused both ways
        with pytest.raises(UnicodeEncodeError):
            canonical_json(record)
        return
    assert canonical_json(record) == expected


async def test_refusals_are_unchanged(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "a.jsonl")
    await audit.start()
    for bad in (math.nan, math.inf, -math.inf):
        with pytest.raises(ValueError):
            await audit.append("x", value=[bad])
    await audit.close()
    line = canonical_json({"seq": 1, "x": 1.5}).replace(b"1.5", b"NaN")
    with pytest.raises(ValueError, match="NaN is not JSON"):
        decode_line(line)
    with pytest.raises(TypeError):
        canonical_json({"x": object()})
    with pytest.raises(UnicodeEncodeError):
        canonical_json({"x": "\ud800"})


def test_a_log_written_the_old_way_verifies(tmp_path: Path) -> None:
    path = tmp_path / "old.jsonl"
    prev = GENESIS_HASH
    lines = []
    for seq, record in enumerate(CORPUS, start=1):
        record = {**record, "seq": seq, "ts": "2026-11-01T00:00:00.000000Z", "type": "x"}
        record["prev_hash"] = prev
        body = stdlib_canonical(record)
        record["hash"] = prev = hashlib.sha256(prev.encode("ascii") + b"\n" + body).hexdigest()
        lines.append(stdlib_canonical(record) + b"\n")
    path.write_bytes(b"".join(lines))
    report = verify_file(path)
    assert report.ok and report.records == len(CORPUS), report.describe()


async def test_a_log_written_now_verifies_by_the_documented_recipe(tmp_path: Path) -> None:
    path = tmp_path / "new.jsonl"
    audit = AuditLog(path)
    await audit.start()
    for i, record in enumerate(CORPUS):
        await audit.append("x", request_id=f"req_{i}", fields=record)
    await audit.close()
    prev = GENESIS_HASH
    for line in path.read_bytes().splitlines():
        record = json.loads(line)
        assert stdlib_canonical(record) == line  # the line is the stdlib's bytes
        body = stdlib_canonical({k: v for k, v in record.items() if k != "hash"})
        assert hashlib.sha256(prev.encode("ascii") + b"\n" + body).hexdigest() == record["hash"]
        prev = record["hash"]
    assert verify_file(path).ok
