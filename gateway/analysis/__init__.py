"""Static analysis of submitted code: what it imports, calls and might do.

`analyse(language, code)` is a pure function on the request's hot path. It never
raises on hostile input: code it cannot parse (syntax errors, pathological
nesting, null bytes, over `max_chars`) is reported as `parsed: false`, and its
features then come from a conservative text scan over the whole code, so that
padding or breaking a program cannot hide a feature the scan would see.

`analyse_request` adds the request's input files: a program can import, source
or load them, so what they do counts as what the code does (`import helper` with
a `helper.py` that imports ctypes loads native code).

The result is advisory: it lets policy ask for approval or monitor, but code
can always hide intent from static analysis. Isolation is the sandbox's job.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable
from typing import Any

from gateway.analysis import bash, javascript, python
from gateway.analysis.findings import Findings
from gateway.analysis.textscan import scan

# Above this many characters code is not parsed, only scanned: parsing costs
# about 2 ms per KiB here (128 KiB of Python: ~0.3 s), the scan ~25 ms per MiB.
DEFAULT_MAX_CHARS = 128 * 1024

FEATURES = (
    "subprocess",
    "network",
    "dynamic_code",
    "filesystem_write",
    "native_code",
    "environment",
    "threads",
)

_ANALYSERS = {
    "python": python.analyse,
    "bash": bash.analyse,
    "javascript": javascript.analyse,
}


def analyse(language: str, code: str, *, max_chars: int = DEFAULT_MAX_CHARS) -> dict[str, Any]:
    """{"parsed", "imports", "calls", "features"}: sorted, de-duplicated, bounded lists."""
    analyser = _ANALYSERS.get(language)
    findings: Findings | None = None
    if analyser is not None and len(code) <= max_chars:
        findings = analyser(code)
    if findings is None or not findings.parsed:
        fallback = scan(language, code)
        if findings is not None:
            fallback.merge(findings)
        findings = fallback
    return findings.as_dict()


# An input file's language by its name (or its shebang). Other text is read as the
# request's own language, and counts only where it parses as that: a program can
# exec or source such a file, while a CSV or a README is not code.
_EXTENSIONS = {
    ".py": "python",
    ".pyw": "python",
    ".sh": "bash",
    ".bash": "bash",
    ".js": "javascript",
    ".mjs": "javascript",
    ".cjs": "javascript",
}
_SHEBANGS = {"python": "python", "bash": "bash", "sh": "bash", "node": "javascript"}
# Loaded by the interpreter without any source to read: native objects and bytecode.
_NATIVE_SUFFIXES = (".so", ".pyd", ".node", ".dylib", ".dll")
_BYTECODE_SUFFIXES = (".pyc", ".pyo")
_ELF = b"\x7fELF"


def _file_language(path: str, text: str) -> str | None:
    """By its shebang (`#!/usr/bin/env python3`), else its extension, else None."""
    if text.startswith("#!"):
        words = text.split("\n", 1)[0][2:].split()
        if words and posixpath.basename(words[0]) == "env":
            words = [w for w in words[1:] if not w.startswith("-")]
        if words:
            name = posixpath.basename(words[0]).rstrip("0123456789.")
            if name in _SHEBANGS:
                return _SHEBANGS[name]
    return _EXTENSIONS.get(posixpath.splitext(path)[1].lower())


def _binary_findings(path: str, content: bytes) -> Findings:
    findings = Findings(parsed=True)
    name = posixpath.basename(path).lower()
    if content.startswith(_ELF) or name.endswith(_NATIVE_SUFFIXES) or ".so." in name:
        findings.features.add("native_code")
    if name.endswith(_BYTECODE_SUFFIXES):
        findings.features.add("dynamic_code")
    return findings


def analyse_request(
    language: str,
    code: str,
    files: Iterable[tuple[str, bytes]],
    *,
    max_chars: int = DEFAULT_MAX_CHARS,
) -> dict[str, Any]:
    """`analyse` of the code, with what every input file adds to its imports, calls
    and features. `parsed` stays the code's own. Files are parsed while the total
    stays under `max_chars`; past that they are only scanned (bounded cost: every
    file is at most one parse or one scan)."""
    result = analyse(language, code, max_chars=max_chars)
    merged = Findings(
        parsed=result["parsed"],
        imports=set(result["imports"]),
        calls=set(result["calls"]),
        features=set(result["features"]),
    )
    budget = max_chars - len(code)
    for path, content in files:
        merged.merge(_binary_findings(path, content))
        try:
            text = content.decode("utf-8")
        except UnicodeDecodeError:
            continue  # not text: only what it is (native, bytecode) counts
        file_language = _file_language(path, text)
        # Past the budget a file is scanned, never skipped: padding hides nothing.
        parse = len(text) <= budget
        found = analyse(file_language or language, text, max_chars=budget if parse else 0)
        if parse:
            budget -= len(text)
            if file_language is None and not found["parsed"]:
                continue  # text that is not code in the request's language: data
        merged.merge(
            Findings(
                imports=set(found["imports"]),
                calls=set(found["calls"]),
                features=set(found["features"]),
            )
        )
    return merged.as_dict()
