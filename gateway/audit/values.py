"""Turn event field values into plain JSON values before they enter the audit chain.

The chain hashes canonical JSON, so every value must serialise one way only and
survive a round trip unchanged. Conversions (documented, so readers know what
they see): Enum -> its value; tuple -> list; set/frozenset -> list sorted by
canonical JSON; bytes/bytearray/memoryview -> standard base64 text; datetime ->
RFC 3339 (UTC as `Z` when aware); date -> ISO date; Path -> str; dataclass ->
object; pydantic model -> `model_dump(mode="json")`; strings with lone
surrogates (undecodable input) -> backslash escapes. Refused with TypeError:
non-string mapping keys and any other type; with ValueError: NaN/Infinity and
nesting deeper than `MAX_DEPTH`.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
from collections.abc import Mapping
from datetime import UTC, date, datetime
from enum import Enum
from pathlib import PurePath
from typing import Any

MAX_DEPTH = 32


def jsonable(value: Any, _depth: int = 0) -> Any:
    """A plain-JSON copy of `value` (see the module docstring for the rules)."""
    if _depth > MAX_DEPTH:
        raise ValueError(f"audit field nested deeper than {MAX_DEPTH} levels")
    # Exact built-in types first: nearly every value of every record is one, and a
    # request writes several records on the event loop. Subclasses (IntEnum, a str
    # Enum, OrderedDict) take the general path below.
    kind = type(value)
    if kind is str:
        return value if value.isascii() else _clean_str(value)
    if kind is int or kind is bool or value is None:
        return value
    if kind is dict:
        return _object(value, _depth)
    if kind is list:
        return [jsonable(item, _depth + 1) for item in value]
    if isinstance(value, Enum):
        return jsonable(value.value, _depth + 1)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, str):
        return _clean_str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"audit field value {value!r} is not valid JSON")
        return float(value)
    if isinstance(value, Mapping):
        return _object(value, _depth)
    if isinstance(value, list | tuple):
        return [jsonable(item, _depth + 1) for item in value]
    if isinstance(value, set | frozenset):
        items = [jsonable(item, _depth + 1) for item in value]
        return sorted(items, key=lambda item: json.dumps(item, sort_keys=True))
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC)
            return value.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return value.isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, PurePath):
        return _clean_str(str(value))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
        return jsonable(fields, _depth + 1)
    dump = getattr(value, "model_dump", None)
    if callable(dump):  # pydantic model, without importing pydantic here
        return jsonable(dump(mode="json"), _depth + 1)
    raise TypeError(f"audit field of type {type(value).__name__} is not JSON-serialisable")


def _object(value: Mapping[Any, Any], depth: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise TypeError(f"audit field keys must be strings, got {type(key).__name__}")
        out[_clean_str(key)] = jsonable(item, depth + 1)
    return out


def _clean_str(value: str) -> str:
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        # Lone surrogates cannot be written as UTF-8; keep them visible as escapes.
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value
