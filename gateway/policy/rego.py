"""The regopy (rego-cpp) binding: compile once, evaluate one input, explain errors.

A `CompiledPolicy` holds one interpreter and its bundle and must only ever be
used from one thread. Traps of rego-cpp 1.5 handled here:
- evaluation errors come back as an "ok" output whose text is an S-expression,
  not JSON, and some policies make it print invalid JSON: both are errors here;
- input strings are kept as JSON-escaped text, so input is passed as JSON text
  (never as a regopy `Input`, which truncates at NUL and breaks on newlines);
- a lone UTF-16 surrogate cannot be encoded as UTF-8, so such input is sent
  ASCII-escaped instead (rego-cpp then sees escapes for all non-ASCII text).
"""

from __future__ import annotations

import json
import re
from typing import Any

from regopy import Interpreter, LogLevel, RegoError
from regopy.rego_shared import (
    rego,
    rego_bundle_query_entrypoint,
    rego_free_output,
    rego_node_get,
    rego_node_size,
    rego_node_value,
    rego_output_node,
    rego_output_ok,
    rego_output_string,
)

from gateway.json_codec import loads
from gateway.policy.base import DECISION_PATH, REVIEW_PATH, PolicyEngineError
from gateway.policy.sources import PolicySources

_UNDEFINED = object()
_ERROR_MESSAGE_KIND = 1801  # regopy NodeKind.ErrorMessage
_ERROR_CODE_KIND = 1803  # regopy NodeKind.ErrorCode
_MAX_ERRORS = 5

# A well-formed input used to smoke-test a freshly compiled policy, so errors
# that do not depend on the input (an unknown function, recursion) surface at
# start-up rather than on the first request.
PROBE_INPUT: dict[str, Any] = {
    "version": "execgate.input/v1",
    "request": {
        "id": "req_probe",
        "time": "1970-01-01T00:00:00Z",
        "ingress": "rest",
        "tool_name": "",
        "source_ip": "127.0.0.1",
    },
    "subject": {"sub": "probe", "tenant": "probe", "scopes": [], "claims": {}},
    "tenant": {
        "id": "probe",
        "ceilings": {},
        "usage": {"concurrent": 0, "cpu_s_last_hour": 0},
        "languages": [],
    },
    "execution": {
        "language": "python",
        "code": "",
        "code_sha256": "",
        "code_bytes": 0,
        "files": [],
        "limits": {},
        "egress": [],
        "backend": "",
    },
    "analysis": {"parsed": True, "imports": [], "calls": [], "features": []},
    "approval": {"present": False},
}


class CompiledPolicy:
    def __init__(self, sources: PolicySources) -> None:
        self._sources = sources
        self._rego = Interpreter()
        # rego-cpp prints diagnostics to stdout by default; errors come back to us.
        self._rego.log_level = LogLevel.NONE
        for name, text in sources.modules.items():
            try:
                self._rego.add_module(name, text)
            except RegoError as exc:
                raise PolicyEngineError("invalid", format_errors(str(exc), sources)) from None
        try:
            if sources.data:
                self._rego.add_data_json(json.dumps(sources.data))
            self._bundle = self._rego.build(None, [DECISION_PATH, REVIEW_PATH])
        except RegoError as exc:
            raise PolicyEngineError("invalid", format_errors(str(exc), sources)) from None
        if not self._bundle.ok():
            raise PolicyEngineError("invalid", f"policy in {sources.root} did not compile")

    def evaluate(self, input: Any) -> Any:
        """The decision value, `UNDEFINED`-free: undefined raises PolicyEngineError."""
        value = self.evaluate_raw(input)
        if value is _UNDEFINED:
            raise PolicyEngineError("invalid", "data.execgate.decision is undefined")
        return value

    def review(self, input: Any) -> Any:
        """data.execgate.review, or None where the policy leaves it undefined."""
        value = self.evaluate_raw(input, REVIEW_PATH)
        return None if value is _UNDEFINED else value

    def evaluate_raw(self, input: Any, path: str = DECISION_PATH) -> Any:
        self._set_input(input)
        try:
            impl = rego_bundle_query_entrypoint(self._rego._impl, self._bundle._impl, path)
        except RegoError as exc:
            raise PolicyEngineError("invalid", f"policy evaluation failed: {exc}") from None
        try:
            if not rego_output_ok(impl):
                messages = _error_messages(rego_output_node(impl))
                raise PolicyEngineError(
                    "invalid", "policy evaluation failed: " + ("; ".join(messages) or "unknown")
                )
            text = rego_output_string(impl)
        finally:
            rego_free_output(impl)
        return _parse_output(text)

    def probe(self) -> None:
        """Raise PolicyEngineError if the policy fails on a well-formed input."""
        self.evaluate_raw(PROBE_INPUT)

    def _set_input(self, input: Any) -> None:
        try:
            text = json.dumps(input, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise PolicyEngineError("invalid", f"policy input is not JSON: {exc}") from None
        try:
            self._rego.set_input_term(text)
        except UnicodeEncodeError:
            self._rego.set_input_term(json.dumps(input, allow_nan=False))
        except RegoError as exc:
            raise PolicyEngineError("invalid", f"policy input rejected: {exc}") from None


def _parse_output(text: str) -> Any:
    if text == "undefined":
        return _UNDEFINED
    if not text.startswith(("{", "[")):
        messages = _messages_from_text(text)
        raise PolicyEngineError(
            "invalid", "policy evaluation failed: " + ("; ".join(messages) or text[:200])
        )
    try:
        parsed = loads(text, where="policy output")
    except ValueError as exc:
        raise PolicyEngineError(
            "invalid", f"policy engine produced unreadable output: {exc}"
        ) from None
    results = parsed if isinstance(parsed, list) else [parsed]
    if len(results) != 1 or not isinstance(results[0], dict):
        raise PolicyEngineError("invalid", "data.execgate.decision has more than one value")
    expressions = results[0].get("expressions", [])
    if not expressions:
        return _UNDEFINED
    if len(expressions) != 1:
        raise PolicyEngineError("invalid", "data.execgate.decision has more than one value")
    return expressions[0]


def _error_messages(node: int, depth: int = 0) -> list[str]:
    """Collect ErrorMessage (and ErrorCode) values from an error node tree."""
    if not node or depth > 6:
        return []
    kind = rego.regoNodeType(node)
    if kind in (_ERROR_MESSAGE_KIND, _ERROR_CODE_KIND):
        try:
            value = rego_node_value(node)
        except RegoError:
            return []
        return [value] if value else []
    found: list[str] = []
    for i in range(min(rego_node_size(node), 32)):
        found += _error_messages(rego_node_get(node, i), depth + 1)
        if len(found) >= 2 * _MAX_ERRORS:
            break
    return found


_MSG_RE = re.compile(rb"\(errormsg (\d+):")
_ERR_RE = re.compile(rb"\(error(?=[\s)])(?: (\d+):)?")
_POS_RE = re.compile(rb"\|(\d+)\|(\d+)")


def _messages_from_text(text: str) -> list[str]:
    data = text.encode("utf-8", "replace")
    out = []
    for match in _MSG_RE.finditer(data):
        size = int(match.group(1))
        out.append(data[match.end() : match.end() + size].decode("utf-8", "replace"))
    return out[:_MAX_ERRORS]


def format_errors(text: str, sources: PolicySources) -> str:
    """rego-cpp's S-expression error list -> "file:line:col: message; ..."."""
    data = text.encode("utf-8", "replace")
    found: list[str] = []
    for match in _ERR_RE.finditer(data):
        where = ""
        rest = match.end()
        if match.group(1) is not None:
            size = int(match.group(1))
            name = data[rest : rest + size].decode("utf-8", "replace")
            rest += size
            where = name
            pos = _POS_RE.match(data, rest)
            if pos and name in sources.modules:
                line, col = _line_col(sources.modules[name], int(pos.group(1)))
                where = f"{name}:{line}:{col}"
        msg = _MSG_RE.search(data, rest)
        if msg is None:
            continue
        size = int(msg.group(1))
        message = data[msg.end() : msg.end() + size].decode("utf-8", "replace")
        entry = f"{where}: {message}" if where else message
        if entry not in found:
            found.append(entry)
    if not found:
        return "policy did not compile: " + text.strip()[:500]
    return "; ".join(found[:_MAX_ERRORS])


def _line_col(source: str, offset: int) -> tuple[int, int]:
    prefix = source.encode("utf-8")[:offset].decode("utf-8", "replace")
    line = prefix.count("\n") + 1
    col = len(prefix) - (prefix.rfind("\n") + 1) + 1
    return line, col
