"""OPA as the policy compiler: find its binary, build the policy to WebAssembly.

The embedded engine evaluates what `opa build -t wasm` makes of the policy, so
the Rego is parsed, type-checked and planned by the same OPA the server runs.
Compilation happens at start-up and on reload only, in a subprocess (never on
the event loop, never per request), over a private copy of exactly the files
the engine loaded: the revision it reports is the one it compiled.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import tarfile
import tempfile
from pathlib import Path

from gateway.policy.base import DECISION_PATH, MASK_PATH, REVIEW_PATH, PolicyEngineError
from gateway.policy.sources import PolicySources

OPA_VERSION = "v1.22.4"


def cached_opa() -> Path:
    """Where `make opa` puts its build (the Makefile's OPA_DIR)."""
    return Path.home() / ".cache" / "execgate" / "opa" / OPA_VERSION / "opa"


_BUILD_TIMEOUT_S = 120.0
_ERROR_CHARS = 2000


class OpaNotFound(PolicyEngineError):
    def __init__(self, tried: list[str]) -> None:
        super().__init__(
            "unavailable",
            "no OPA binary to compile the policy (tried "
            + ", ".join(tried)
            + "): run `make opa`, or set EXECGATE_OPA_BIN or policy.opa_bin",
        )


def find_opa_binary(configured: str = "") -> str:
    """$EXECGATE_OPA_BIN, then policy.opa_bin, then `opa` on PATH, then `make opa`'s cache."""
    tried: list[str] = []
    candidates = [
        ("EXECGATE_OPA_BIN", os.environ.get("EXECGATE_OPA_BIN", "")),
        ("policy.opa_bin", configured),
        ("PATH", shutil.which("opa") or ""),
        ("cache", str(cached_opa())),
    ]
    for where, candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
        tried.append(f"{where}={candidate}" if candidate else f"{where} (unset)")
    raise OpaNotFound(tried)


async def build_wasm(opa_bin: str, sources: PolicySources) -> bytes:
    """policy.wasm for data.execgate.decision (and data.execgate.review and
    data.system.log.mask where the policy defines them), or
    PolicyEngineError("invalid") naming the file."""
    entrypoints = [DECISION_PATH, REVIEW_PATH, MASK_PATH]
    while True:
        try:
            return await _build_wasm(opa_bin, sources, tuple(entrypoints))
        except PolicyEngineError as exc:
            absent = [
                path for path in entrypoints[1:]
                if f'entrypoint "{path}" does not refer to a rule' in exc.message
            ]  # fmt: skip
            if not absent:
                raise
            entrypoints = [path for path in entrypoints if path not in absent]


async def _build_wasm(opa_bin: str, sources: PolicySources, entrypoints: tuple[str, ...]) -> bytes:
    with tempfile.TemporaryDirectory(prefix="execgate-policy-") as tmp:
        work = Path(tmp)
        tree = work / "policy"
        await asyncio.to_thread(_write_tree, tree, sources)
        out = work / "bundle.tar.gz"
        proc = await asyncio.create_subprocess_exec(
            opa_bin, "build", "--target", "wasm",
            *(arg for path in entrypoints for arg in ("--entrypoint", path)),
            "--output", str(out), str(tree),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        try:
            output, _ = await asyncio.wait_for(proc.communicate(), _BUILD_TIMEOUT_S)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise PolicyEngineError(
                "invalid", f"`opa build` took over {_BUILD_TIMEOUT_S:.0f} s on {sources.root}"
            ) from None
        if proc.returncode != 0:
            text = output.decode(errors="replace").strip()
            # Name the operator's files, not the private copy.
            text = text.replace(f"{tree}/", f"{sources.root}/").replace(
                str(tree), str(sources.root)
            )
            if f'entrypoint "{DECISION_PATH}" does not refer to a rule' in text:
                text = f"the policy in {sources.root} defines no data.execgate.decision rule"
            raise PolicyEngineError("invalid", text[:_ERROR_CHARS] or "`opa build` failed")
        return await asyncio.to_thread(_policy_wasm, out)


def _write_tree(tree: Path, sources: PolicySources) -> None:
    for name, text in sources.modules.items():
        target = tree / Path(name).relative_to(sources.root)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    if sources.data:
        (tree / "data.json").write_text(json.dumps(sources.data), encoding="utf-8")


def _policy_wasm(bundle: Path) -> bytes:
    with tarfile.open(bundle, "r:gz") as tar:
        for member in tar.getmembers():
            if member.name.lstrip("/") == "policy.wasm":
                extracted = tar.extractfile(member)
                if extracted is not None:
                    return io.BytesIO(extracted.read()).getvalue()
    raise PolicyEngineError("invalid", "`opa build` produced no policy.wasm")
