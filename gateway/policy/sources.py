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


def _policy_files(root: Path) -> list[tuple[Path, bool]]:
    """(file, is_module) for every file the engines load, in a stable order."""
    if not root.is_dir():
        raise PolicyEngineError("invalid", f"policy directory not found: {root}")
    found = []
    for file in sorted(p for p in root.rglob("*") if p.is_file() and _visible(p, root)):
        is_module = file.suffix == ".rego" and not file.name.endswith("_test.rego")
        if is_module or file.name == "data.json":
            found.append((file, is_module))
    return found


def _read(file: Path) -> bytes:
    try:
        return file.read_bytes()
    except OSError as exc:
        raise PolicyEngineError("invalid", f"{file}: unreadable: {exc}") from None


def _digest_entry(root: Path, file: Path, raw: bytes) -> bytes:
    return file.relative_to(root).as_posix().encode() + b"\0" + raw + b"\0"


def fingerprint(root: Path) -> str:
    """The revision `load_sources(root)` would report, without parsing anything.

    Cheap enough to poll (a few small reads); blocking, so call it from a thread.
    """
    digest = hashlib.sha256()
    for file, _ in _policy_files(root):
        digest.update(_digest_entry(root, file, _read(file)))
    return digest.hexdigest()


def load_sources(root: Path) -> PolicySources:
    """Read `root`; blocking file I/O, so call it from a thread."""
    digest = hashlib.sha256()
    modules: dict[str, str] = {}
    data: dict[str, Any] = {}
    for file, is_module in _policy_files(root):
        raw = _read(file)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PolicyEngineError("invalid", f"{file}: unreadable: {exc}") from None
        digest.update(_digest_entry(root, file, raw))
        if is_module:
            modules[str(file)] = text
            continue
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise PolicyEngineError("invalid", f"{file}: invalid JSON: {exc}") from None
        _nest(data, file.relative_to(root).parent.parts, doc, file)
    if not modules:
        raise PolicyEngineError("invalid", f"no policy modules (*.rego) in {root}")
    return PolicySources(root=root, modules=modules, data=data, revision=digest.hexdigest())
