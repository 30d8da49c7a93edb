"""The one JSON decoder (and encoder) of the gateway.

Every JSON document the gateway reads goes through `loads`: client bodies, tool-call
argument strings, MCP messages, approval decisions and callbacks, JWTs, and the
answers of OPA, an MCP upstream and a JWKS endpoint. The rules (THREAT_MODEL.md,
"Parsing"):

* at most `max_depth` nested arrays/objects (`MAX_DEPTH`), and at most `max_bytes`
  where the caller gives a bound: a parser bomb is a 400, never a RecursionError;
* no duplicate object keys anywhere: two readers of one document (this gateway and
  the policy engine, a backend, an audit reader) must not disagree on what it says;
* strict RFC 8259: no NaN/Infinity, UTF-8 only, no lone surrogates.

Fast path (all of it in C but a walk that deep documents alone need): orjson parses
(its own recursion cap is 1024 levels). A document cannot nest deeper than it has
`[` and `{` bytes, so a short one with no more than `max_depth` of them is not walked
for its depth. A duplicate key is invisible in the parsed value (orjson keeps the last one)
but not in a count: in a valid JSON text each `:` outside a string separates exactly
one member, and a `:` inside a string is literal or the escape `\\u003a`. orjson
writes every member's `:` and every string's colon literally, so when the text holds
no such escape, the text and orjson's re-encoding of the value have the same number
of `:` exactly when no member was dropped. Only on a mismatch (or with the escape
present) does the exact slow path run: the stdlib parser with an `object_pairs_hook`,
safe now that the depth is known to be small, which names the key and where it sits.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import orjson
from aiohttp import web

MAX_DEPTH = 64
_COUNT_BELOW = 16 * 1024
_ESCAPED_COLON = re.compile(rb"\\u003[aA]")


class JsonError(ValueError):
    """The document is not one the gateway reads; `where` names it (`body`, `arguments.x`)."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where
        self.reason = message


def loads(
    data: bytes | bytearray | memoryview | str,
    *,
    where: str = "body",
    max_depth: int = MAX_DEPTH,
    max_bytes: int | None = None,
) -> Any:
    """Parse `data` under the rules above; raises JsonError naming `where`."""
    if isinstance(data, str):
        try:
            raw = data.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise JsonError(where, f"not valid UTF-8 text at character {exc.start}") from None
    else:
        raw = bytes(data)
    if max_bytes is not None and len(raw) > max_bytes:
        raise JsonError(where, f"over {max_bytes} bytes")
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc) or "recursion" in str(exc):
            raise JsonError(where, f"nested deeper than {max_depth} levels") from None
        raise JsonError(where, f"malformed JSON: {exc}") from None
    # A short text cannot nest deeper than its brackets (two C scans); a long one is
    # walked, which costs per container rather than per byte.
    deep_enough = len(raw) > _COUNT_BELOW or raw.count(b"[") + raw.count(b"{") > max_depth
    if deep_enough and _depth(value, max_depth) > max_depth:
        raise JsonError(where, f"nested deeper than {max_depth} levels")
    if raw.count(b":") != orjson.dumps(value).count(b":") or (
        b"\\" in raw and _ESCAPED_COLON.search(raw)  # memchr first: most texts skip the regex
    ):
        _refuse_duplicates(raw, where)
    return value


def _depth(value: Any, limit: int) -> int:
    """How deep `value`'s containers nest (counting stops past `limit`)."""
    level = [value] if type(value) is dict or type(value) is list else []
    depth = 0
    while level and depth <= limit:
        depth += 1
        below: list[Any] = []
        for node in level:
            items = node.values() if type(node) is dict else node
            below += [c for c in items if type(c) is dict or type(c) is list]
        level = below
    return depth


class _Members(list[tuple[str, Any]]):
    """An object as the stdlib parser wrote it: every member, duplicates kept."""


def _refuse_duplicates(raw: bytes, where: str) -> None:
    doc = json.loads(raw, object_pairs_hook=_Members)  # depth already bounded
    stack: list[tuple[Any, str]] = [(doc, where)]
    while stack:
        node, path = stack.pop()
        if isinstance(node, _Members):
            seen: set[str] = set()
            for key, item in node:
                if key in seen:
                    raise JsonError(path, f"duplicate object key {key!r}")
                seen.add(key)
                stack.append((item, _child(path, key)))
        elif isinstance(node, list):
            stack.extend((item, _child(path, i)) for i, item in enumerate(node))


def _child(path: str, key: str | int) -> str:
    # Fields inside a body are named as the models name them: `limits.pids`.
    return str(key) if path == "body" else f"{path}.{key}"


def dumps(value: Any, *, sort_keys: bool = False) -> bytes:
    """Compact UTF-8 JSON (orjson; the stdlib for what orjson refuses, e.g. ints over
    64 bits or a lone surrogate, which it writes as an escape)."""
    option = orjson.OPT_NON_STR_KEYS | (orjson.OPT_SORT_KEYS if sort_keys else 0)
    try:
        return orjson.dumps(value, option=option)
    except TypeError:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=sort_keys)
        return text.encode("utf-8", "backslashreplace")


def json_response(
    body: Any, *, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    """`web.json_response` with orjson's encoding (the API's hot path)."""
    return web.Response(
        body=dumps(body),
        status=status,
        headers=headers,
        content_type="application/json",
        charset="utf-8",
    )
