"""JavaScript (Node): best-effort regular expressions, no parser.

Always `parsed: false`: strings and comments are not told apart from code, so
findings over-report. Imports come from require(), import ... from, and
import(); the `node:` prefix is dropped so policies match one name.
"""

from __future__ import annotations

import re

from gateway.analysis.findings import Findings

_IMPORTS = re.compile(
    r"""\brequire\s*\(\s*(['"`])([^'"`\n]{1,200})\1\s*\)"""
    r"""|\bimport\s*\(\s*(['"`])([^'"`\n]{1,200})\3\s*\)"""
    r"""|\bimport\s+(?:[\w*${}\s,]+\s+from\s+)?(['"])([^'"\n]{1,200})\5"""
    r"""|\bfrom\s+(['"])([^'"\n]{1,200})\7"""
)
_CALLS = re.compile(r"\b([A-Za-z_$][\w$]*(?:\s*\.\s*[A-Za-z_$][\w$]*){0,4})\s*\(")
_KEYWORDS = {
    "if", "for", "while", "switch", "catch", "function", "return", "typeof", "await",
    "new", "super", "with", "do", "else", "yield", "delete", "void", "in", "of",
}  # fmt: skip

_MODULE_FEATURES = {
    "child_process": "subprocess",
    "cluster": "subprocess",
    "net": "network",
    "http": "network",
    "https": "network",
    "http2": "network",
    "dgram": "network",
    "tls": "network",
    "dns": "network",
    "undici": "network",
    "axios": "network",
    "node-fetch": "network",
    "ws": "network",
    "vm": "dynamic_code",
    "worker_threads": "threads",
    "ffi-napi": "native_code",
    "ffi": "native_code",
    "node-ffi": "native_code",
}
_TEXT_FEATURES = {
    "network": re.compile(r"\bfetch\s*\(|\bWebSocket\b|\bXMLHttpRequest\b"),
    "dynamic_code": re.compile(
        r"\beval\s*\(|\bnew\s+Function\b|\bFunction\s*\(|\bset(?:Timeout|Interval)\s*\(\s*['\"`]"
    ),
    "filesystem_write": re.compile(
        r"\b(?:writeFile|appendFile|createWriteStream|mkdir|rmdir|unlink|rename|copyFile|rm"
        r"|symlink|truncate|chmod)(?:Sync)?\s*\("
    ),
    "native_code": re.compile(r"\bprocess\s*\.\s*dlopen\b|\.node['\"`]\s*\)"),
    "environment": re.compile(r"\bprocess\s*\.\s*env\b"),
    "subprocess": re.compile(r"\bprocess\s*\.\s*binding\s*\(\s*['\"]spawn"),
}


def analyse(code: str) -> Findings:
    found = Findings(parsed=False)
    for match in _IMPORTS.finditer(code):
        module = next(g for g in match.groups()[1::2] if g is not None)
        module = module.removeprefix("node:")
        found.imports.add(module)
        if feature := _MODULE_FEATURES.get(module.split("/")[0]):
            found.features.add(feature)
    for match in _CALLS.finditer(code):
        name = re.sub(r"\s+", "", match.group(1))
        if name.split(".")[0] not in _KEYWORDS:
            found.calls.add(name)
    for feature, pattern in _TEXT_FEATURES.items():
        if pattern.search(code):
            found.features.add(feature)
    return found
