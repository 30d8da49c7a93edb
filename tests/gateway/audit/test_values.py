"""Conversion of event field values to plain JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from enum import Enum
from pathlib import Path

import pytest
from pydantic import BaseModel

from gateway.audit.values import MAX_DEPTH, jsonable


class Color(Enum):
    RED = "red"


@dataclass(frozen=True)
class Usage:
    cpu_ms: int
    status: Color


class Limits(BaseModel):
    timeout_s: float
    memory_mb: int


def test_conversions_round_trip_through_json() -> None:
    value = {
        "enum": Color.RED,
        "dataclass": Usage(30, Color.RED),
        "model": Limits(timeout_s=5, memory_mb=256),
        "aware": datetime(2026, 1, 2, 5, 0, tzinfo=timezone(timedelta(hours=2))),
        "naive": datetime(2026, 1, 2, 3, 4, 5),
        "day": date(2026, 1, 2),
        "path": Path("/tmp/x"),
        "bytes": b"\x00\x01",
        "set": frozenset({3, 1, 2}),
        "tuple": (1, "a", None, True, 1.5),
    }
    out = jsonable(value)
    assert out == {
        "enum": "red",
        "dataclass": {"cpu_ms": 30, "status": "red"},
        "model": {"timeout_s": 5.0, "memory_mb": 256},
        "aware": "2026-01-02T03:00:00.000000Z",
        "naive": "2026-01-02T03:04:05",
        "day": "2026-01-02",
        "path": "/tmp/x",
        "bytes": "AAE=",
        "set": [1, 2, 3],
        "tuple": [1, "a", None, True, 1.5],
    }
    assert json.loads(json.dumps(out)) == out


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (object(), TypeError),
        ({1: "x"}, TypeError),
        (float("inf"), ValueError),
        (float("nan"), ValueError),
    ],
)
def test_refused(value: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        jsonable(value)


def test_depth_limit() -> None:
    nested: list = []
    for _ in range(MAX_DEPTH + 2):
        nested = [nested]
    with pytest.raises(ValueError, match="nested"):
        jsonable(nested)


def test_subclasses_of_plain_types_convert_like_their_kind() -> None:
    # The exact-type fast path must not swallow them: an IntEnum is an int, a str
    # Enum a str, an OrderedDict a dict, a namedtuple a tuple; each comes out plain.
    from collections import OrderedDict, namedtuple
    from enum import IntEnum, StrEnum

    class Level(IntEnum):
        HIGH = 3

    class Mode(StrEnum):
        FAST = "fast"

    pair = namedtuple("pair", "a b")
    value = {
        "level": Level.HIGH,
        "mode": Mode.FAST,
        "ordered": OrderedDict([("b", Level.HIGH), ("a", "\udcff")]),
        "pair": pair(Mode.FAST, True),
        "nested": [[{"x": None, "y": 1.5, "z": "é"}]],
    }
    out = jsonable(value)
    assert out == {
        "level": 3,
        "mode": "fast",
        "ordered": {"b": 3, "a": "\\udcff"},
        "pair": ["fast", True],
        "nested": [[{"x": None, "y": 1.5, "z": "é"}]],
    }
    assert type(out["level"]) is int and type(out["mode"]) is str
    assert type(out["ordered"]) is dict and type(out["pair"]) is list
    assert json.loads(json.dumps(out)) == out
