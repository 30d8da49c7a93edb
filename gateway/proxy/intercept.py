"""Intercept rules of a reverse-proxy route, as pure functions: does a request
match, where its language, code, files and stdin sit (JSON pointers), and the
answer in the upstream's own shape (a template with result fields set at pointers).
"""

from __future__ import annotations

import copy
import fnmatch
import posixpath
import re
from typing import Any
from urllib.parse import unquote_to_bytes

from gateway.settings.ingress import InterceptSettings, RouteSettings

_MISSING = object()


class AmbiguousPath(ValueError):
    """A path an upstream could read as another path than the gateway does."""


# RFC 3986 path characters, without ';' (matrix parameters, which many servers strip).
_PATH_CHARS = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,=:@/]*")
_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_ENCODED_SEPARATOR = re.compile(r"%(2[fF]|5[cC])")


def checked_path(raw_path: str) -> str:
    """The request path decoded once, refusing every spelling that servers disagree
    about: encoded '/' or '\\', double encoding ('%25'), NUL and other controls,
    ';params', '?' or '#' hidden in an escape, non-ASCII, dot segments."""
    if _BAD_ESCAPE.search(raw_path):
        raise AmbiguousPath("malformed percent-encoding")
    if _ENCODED_SEPARATOR.search(raw_path):
        raise AmbiguousPath("an encoded '/' or '\\'")
    try:
        path = unquote_to_bytes(raw_path).decode("utf-8")
    except UnicodeDecodeError:
        raise AmbiguousPath("not UTF-8") from None
    if not _PATH_CHARS.fullmatch(path):
        bad = sorted({c for c in path if not _PATH_CHARS.fullmatch(c)})
        raise AmbiguousPath(f"characters outside the plain path set: {bad!r}")
    if any(segment in (".", "..") for segment in path.split("/")):
        raise AmbiguousPath("dot segments")
    return path


def normal_path(path: str) -> str:
    """The (decoded) path as an upstream might read it: no '//', '.', '..', trailing
    '/', trailing dots of a segment, case. Matching this form errs towards
    interception: "/run/", "//RUN" or "/run." cannot carry code past the pipeline."""
    path = posixpath.normpath("/" + re.sub("/+", "/", path).lstrip("/"))
    return "/".join(s.rstrip(".") if s.strip(".") else s for s in path.split("/")).lower()


def path_rules(route: RouteSettings, path: str) -> list[InterceptSettings]:
    """Every rule whose path matches, whatever its method."""
    path = normal_path(path)
    return [r for r in route.intercept if fnmatch.fnmatchcase(path, normal_path(r.path))]


def find_rule(route: RouteSettings, method: str, path: str) -> InterceptSettings | None:
    for rule in path_rules(route, path):
        if rule.method == method.upper():
            return rule
    return None


def _tokens(pointer: str) -> list[str]:
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer.split("/")[1:]]


def get_pointer(doc: Any, pointer: str) -> Any:
    """RFC 6901 lookup; a missing path gives `_MISSING` (callers decide)."""
    node = doc
    for token in _tokens(pointer):
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            return _MISSING
    return node


def set_pointer(doc: Any, pointer: str, value: Any) -> Any:
    """Set `value` at `pointer`, creating objects on the way; returns the document."""
    tokens = _tokens(pointer)
    if not tokens:
        return value
    if not isinstance(doc, dict):
        doc = {}
    node = doc
    for token in tokens[:-1]:
        child = node.get(token)
        if not isinstance(child, dict):
            child = node[token] = {}
        node = child
    node[tokens[-1]] = value
    return doc


def request_body(rule: InterceptSettings, body: Any) -> dict[str, Any]:
    """The upstream-shaped body as an execution request body (validated later)."""
    out: dict[str, Any] = {}
    language = rule.language
    if language is None:
        found = get_pointer(body, rule.language_pointer)
        language = "python" if found is _MISSING else found
    out["language"] = language
    code = get_pointer(body, rule.code_pointer)
    out["code"] = None if code is _MISSING else code
    for key, pointer in (("files", rule.files_pointer), ("stdin", rule.stdin_pointer)):
        if pointer:
            value = get_pointer(body, pointer)
            if value is not _MISSING:
                out[key] = value
    return out


def answer(rule: InterceptSettings, fields: dict[str, Any]) -> Any:
    """The template with each configured result field set at its pointer."""
    doc = copy.deepcopy(rule.answer_template)
    for name, pointer in rule.answer_pointers.items():
        if name in fields:
            doc = set_pointer(doc, pointer, fields[name])
    return doc
