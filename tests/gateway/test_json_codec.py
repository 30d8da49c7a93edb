"""The one JSON decoder: depth and duplicate keys, against an exact reference.

The reference is the stdlib parser with an `object_pairs_hook` that records every
member: slow, obviously right. The fast decoder (orjson plus counts) must agree with
it on every document hypothesis builds, including the ones made to fool the counts
(colons in keys and strings, the `\\u003a` escape, keys spelled with escapes).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.json_codec import MAX_DEPTH, JsonError, dumps, loads


def _reference(raw: bytes, max_depth: int = MAX_DEPTH) -> tuple[str, Any]:
    """("ok", value) | ("duplicate", key) | ("deep", None), by brute force."""
    duplicates: list[str] = []

    def pairs(members: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [k for k, _ in members]
        duplicates.extend(k for i, k in enumerate(keys) if k in keys[:i])
        return dict(members)

    def depth(value: Any) -> int:
        if isinstance(value, dict):
            return 1 + max(map(depth, value.values()), default=0)
        if isinstance(value, list):
            return 1 + max(map(depth, value), default=0)
        return 0

    value = json.loads(raw, object_pairs_hook=pairs)
    if depth(value) > max_depth:
        return "deep", None
    if duplicates:
        return "duplicate", duplicates[0]
    return "ok", value


def _fast(raw: bytes) -> tuple[str, Any]:
    try:
        return "ok", loads(raw)
    except JsonError as exc:
        if "nested deeper" in exc.reason:
            return "deep", None
        assert "duplicate object key" in exc.reason, exc
        return "duplicate", None


# Keys and strings rich in what could fool a count: colons, quotes, escapes.
_text = st.text(alphabet=st.sampled_from('ab:"\\\u00e9\u2028\U0001f600 ,{}[]'), max_size=6)
_scalars = st.none() | st.booleans() | st.integers(-(2**63), 2**63) | _text
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.lists(st.tuples(_text, inner), max_size=4)
    ),  # members, duplicates allowed
    max_leaves=30,
)


def _encode(value: Any, escape_colons: bool) -> str:
    """JSON text of `value`, where a list of tuples is an object written member by member."""
    if isinstance(value, list) and value and all(isinstance(v, tuple) for v in value):
        members = (f"{_encode(k, escape_colons)}:{_encode(v, escape_colons)}" for k, v in value)
        return "{" + ",".join(members) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_encode(v, escape_colons) for v in value) + "]"
    text = json.dumps(value, ensure_ascii=False)
    return text.replace(":", "\\u003a") if escape_colons and isinstance(value, str) else text


@settings(max_examples=400, deadline=None)
@given(_values, st.booleans(), st.booleans())
def test_fast_decoder_agrees_with_the_reference(value: Any, escape_colons: bool, pad: bool) -> None:
    text = _encode(value, escape_colons)
    raw = (f" \n{text}\t " if pad else text).encode("utf-8")
    expected = _reference(raw)
    got = _fast(raw)
    assert got[0] == expected[0], raw
    if expected[0] == "ok":
        assert got[1] == expected[1]


@pytest.mark.parametrize(
    "raw",
    [
        b'{"language":"python","code":"x","language":"bash"}',
        b'{"language":"python","\\u006canguage":"bash"}',  # the same key, spelled otherwise
        b'{"a\\u003a":1,"a:":2}',  # an escaped colon hides a member from a naive count
        b'{"a":{"b":1},"a":{"b":1}}',  # equal values are still two readings
        b'{"limits":{"pids":1,"pids":99}}',
        b'[{"k":"v:w"},{"k":1,"k":2}]',
        b'{"x":"\\u003a\\u003a","y":1,"y":{"z:":"::"}}',
    ],
)
def test_duplicate_keys_are_refused_wherever_they_sit(raw: bytes) -> None:
    with pytest.raises(JsonError, match="duplicate object key"):
        loads(raw)


def test_duplicate_names_where_it_sits() -> None:
    with pytest.raises(JsonError) as info:
        loads(b'{"limits":{"pids":1,"pids":2}}')
    assert info.value.where == "limits" and "'pids'" in info.value.reason
    with pytest.raises(JsonError) as info:
        loads(b'{"a":[0,{"b":1,"b":1}]}', where="arguments")
    assert info.value.where == "arguments.a.1"


@pytest.mark.parametrize("opener,closer", [(b"[", b"]"), (b'{"a":', b"}")])
@pytest.mark.parametrize("levels", [MAX_DEPTH + 1, 1025, 100_000])
def test_deep_documents_are_refused_not_recursed(opener: bytes, closer: bytes, levels: int) -> None:
    raw = opener * levels + b"1" + closer * levels
    with pytest.raises(JsonError, match=f"nested deeper than {MAX_DEPTH} levels"):
        loads(raw)
    inside = b'{"language":"python","code":"x","limits":' + raw + b"}"
    with pytest.raises(JsonError, match="nested deeper"):
        loads(inside)


def test_depth_at_the_bound_is_read() -> None:
    raw = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    assert loads(raw) is not None
    assert loads(b'{"a":' * (MAX_DEPTH - 1) + b"[]" + b"}" * (MAX_DEPTH - 1))


@pytest.mark.parametrize(
    "raw",
    [b"NaN", b"[Infinity]", b'"\\ud800"', b"\xff", b"\xef\xbb\xbf{}", b"{", b"", b"[1,]"],
)
def test_not_strict_json_is_refused(raw: bytes) -> None:
    with pytest.raises(JsonError, match="malformed JSON"):
        loads(raw)


def test_size_bound_and_text_input() -> None:
    with pytest.raises(JsonError, match="over 10 bytes"):
        loads(b'{"a":"0123456789"}', max_bytes=10)
    assert loads('{"a":"é"}') == {"a": "é"}
    with pytest.raises(JsonError, match="UTF-8"):
        loads('"\ud800"')


def test_dumps_is_compact_utf8_and_takes_what_the_stdlib_takes() -> None:
    assert dumps({"a": "é", 1: [None]}) == '{"a":"é","1":[null]}'.encode()
    assert json.loads(dumps({"big": 2**70})) == {"big": 2**70}


@pytest.mark.parametrize(
    "value",
    [
        {"b": 1, "a": {"d": [2, {"z": 0, "y": 1}], "c": "é"}},
        {"b": 2**70, "a": "x"},  # past orjson: the stdlib's way
        {"b": "\ud800 a lone surrogate", "a": 1},  # likewise, written as its escape
    ],
)
def test_dumps_sorted_round_trips_whatever_it_is_given(value: dict[str, object]) -> None:
    text = dumps(value, sort_keys=True)
    assert json.loads(text) == value
    assert text == json.dumps(value, sort_keys=True, separators=(",", ":"),
                              ensure_ascii=False).encode("utf-8", "backslashreplace")  # fmt: skip
