"""The decision-log mask: `data.system.log.mask` of policies/system/log.rego.

OPA erases the JSON pointers this rule returns from every decision-log entry; the
gateway applies the very same rule (the same file, evaluated by rego-cpp) to the
policy inputs it keeps for `execgate policy replay`, so both records of a decision
leave out the same things (the code, secret-looking claims).

Blocking (rego-cpp calls): run it on a worker thread.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from regopy import Interpreter, LogLevel, RegoError
from regopy.rego_shared import (
    rego_bundle_query_entrypoint,
    rego_free_output,
    rego_output_ok,
    rego_output_string,
)

from gateway.policy.base import MASK_PATH


class MaskError(Exception):
    pass


class LogMask:
    """The mask rule of one policy directory (its `system/` package)."""

    def __init__(self, policy_dir: Path) -> None:
        files = sorted(p for p in (policy_dir / "system").glob("*.rego") if "_test" not in p.name)
        if not files:
            raise MaskError(f"no decision-log mask (system/log.rego) under {policy_dir}")
        self._rego = Interpreter()
        self._rego.log_level = LogLevel.NONE
        try:
            for path in files:
                self._rego.add_module(path.name, path.read_text())
            # Compiled once to a bundle with the mask as its entry point, as the
            # decision engine is (rego.py): a plain query would recompile each time.
            self._bundle = self._rego.build(None, [MASK_PATH])
        except RegoError as exc:
            raise MaskError(f"decision-log mask does not compile: {exc}") from None
        if not self._bundle.ok():
            raise MaskError("decision-log mask does not compile")

    def pointers(self, entry: dict[str, Any]) -> list[str]:
        """The JSON pointers to erase from `entry` ({"input": ..., "result": ...})."""
        try:
            self._rego.set_input_term(json.dumps(entry, allow_nan=False))
            impl = rego_bundle_query_entrypoint(self._rego._impl, self._bundle._impl, MASK_PATH)
        except (RegoError, TypeError, ValueError) as exc:
            raise MaskError(f"decision-log mask failed: {exc}") from None
        try:
            text = rego_output_string(impl)
            if not rego_output_ok(impl) or not text.startswith(("{", "[")):
                raise MaskError(f"decision-log mask failed: {text[:200]}")
        finally:
            rego_free_output(impl)
        parsed = json.loads(text)
        results = parsed if isinstance(parsed, list) else [parsed]
        try:
            value = results[0]["expressions"][0]
        except (IndexError, KeyError, TypeError):
            # Undefined: an entry the rule does not cover is masked wholesale.
            raise MaskError("data.system.log.mask is undefined for this entry") from None
        if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
            raise MaskError("data.system.log.mask must be a set of JSON pointers")
        return sorted(value)

    def apply(self, entry: dict[str, Any], pointers: list[str] | None = None) -> dict[str, Any]:
        """A copy of `entry` with every masked pointer erased (as OPA erases them):
        `pointers` when the decision engine has answered the mask already."""
        return masked_copy(entry, self.pointers(entry) if pointers is None else pointers)


def masked_copy(doc: dict[str, Any], pointers: list[str]) -> dict[str, Any]:
    """`doc` with each pointer erased in turn (as `erase` on a deep copy would), leaving
    `doc` untouched: only the objects and arrays on a pointer's path are copied, the
    rest is shared (a policy input is ~100 values and a mask names a few of them, and
    a deep copy of each input cost more than the rest of keeping it)."""
    masked = dict(doc)
    own = {id(masked)}  # containers of the copy's own, safe to change

    def copied(node: Any, key: str | int) -> Any:
        child = node[key]
        if isinstance(child, dict | list) and id(child) not in own:
            child = dict(child) if isinstance(child, dict) else list(child)
            own.add(id(child))
            node[key] = child
        return child

    for pointer in pointers:
        _erase(masked, pointer, copied)
    return masked


def erase(doc: Any, pointer: str) -> None:
    """Remove what an RFC 6901 pointer names; a pointer to nothing is a no-op."""
    _erase(doc, pointer, lambda node, key: node[key])


def _erase(doc: Any, pointer: str, descend: Callable[[Any, str | int], Any]) -> None:
    if not pointer.startswith("/"):
        return
    tokens = [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]
    node = doc
    for token in tokens[:-1]:
        key = _key(node, token)
        if key is None:
            return
        node = descend(node, key)
    last = _key(node, tokens[-1])
    if last is not None:
        del node[last]


def _key(node: Any, token: str) -> str | int | None:
    """The member or element `token` names in `node`, if it has one."""
    if isinstance(node, dict):
        return token if token in node else None
    if isinstance(node, list) and token.isdigit() and int(token) < len(node):
        return int(token)
    return None
