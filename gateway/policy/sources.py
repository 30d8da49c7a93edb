"""Reading a policy directory: Rego modules, data documents and their revision.

The layout follows OPA's loader so both engines see the same documents: every
`*.rego` below the directory except `*_test.rego`, and every `data.json`, whose
content lands at `data.<relative directory path>`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.policy.base import PolicyEngineError


@dataclass(frozen=True)
class PolicySources:
    root: Path
    # display name (path as given, e.g. "policies/limits.rego") -> source text
    modules: dict[str, str]
    # the merged base document
    data: dict[str, Any]
    # sha256 over every loaded file's relative path and bytes
    revision: str


def _visible(path: Path, root: Path) -> bool:
    return not any(part.startswith(".") for part in path.relative_to(root).parts)


def _nest(data: dict[str, Any], parts: tuple[str, ...], doc: Any, file: Path) -> None:
    """Put `doc` at data.<parts>, merging objects key by key, as OPA does."""
    if not parts and not isinstance(doc, dict):
        raise PolicyEngineError("invalid", f"{file}: top-level data.json must be an object")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise PolicyEngineError("invalid", f"{file}: data path conflicts at {part!r}")
    if parts and not isinstance(doc, dict):
        if parts[-1] in node:
            raise PolicyEngineError("invalid", f"{file}: data at {parts[-1]!r} defined twice")
        node[parts[-1]] = doc
        return
    if parts:
        node = node.setdefault(parts[-1], {})
        if not isinstance(node, dict):
            raise PolicyEngineError("invalid", f"{file}: data path conflicts at {parts[-1]!r}")
    for key, value in doc.items():
        if key in node:
            raise PolicyEngineError("invalid", f"{file}: data key {key!r} defined twice")
        node[key] = value


def load_sources(root: Path) -> PolicySources:
    """Read `root`; blocking file I/O, so call it from a thread."""
    if not root.is_dir():
        raise PolicyEngineError("invalid", f"policy directory not found: {root}")
    digest = hashlib.sha256()
    modules: dict[str, str] = {}
    data: dict[str, Any] = {}
    files = sorted(p for p in root.rglob("*") if p.is_file() and _visible(p, root))
    for file in files:
        rel = file.relative_to(root)
        is_module = file.suffix == ".rego" and not file.name.endswith("_test.rego")
        if not (is_module or file.name == "data.json"):
            continue
        try:
            raw = file.read_bytes()
            text = raw.decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise PolicyEngineError("invalid", f"{file}: unreadable: {exc}") from None
        digest.update(rel.as_posix().encode() + b"\0" + raw + b"\0")
        if is_module:
            modules[str(file)] = text
            continue
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise PolicyEngineError("invalid", f"{file}: invalid JSON: {exc}") from None
        _nest(data, rel.parent.parts, doc, file)
    if not modules:
        raise PolicyEngineError("invalid", f"no policy modules (*.rego) in {root}")
    return PolicySources(root=root, modules=modules, data=data, revision=digest.hexdigest())
