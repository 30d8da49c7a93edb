"""What a load run must leave true: every request audited once, no sandbox left behind.

Audit accounting, exactly: each request the load client sent ends in one terminal
record of the gateway's log (`execution.finished` for a 200, `rate.limited` for a 429
or a queue timeout, `request.rejected` / `auth.failed` for any other refusal), and
every 200 also has its `execution.started`. Records the gateway writes for itself
(`gateway.*`, `policy.*`, `sandbox.*`) are not requests and are not counted.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

TERMINAL = ("execution.finished", "rate.limited", "request.rejected", "auth.failed")


def audit_counts(path: Path) -> dict[str, Counter[str]]:
    """Record type -> tenant -> count (blocking: call from a thread)."""
    counts: dict[str, Counter[str]] = {}
    with path.open("rb") as f:
        for line in f:
            record = json.loads(line)
            counts.setdefault(record["type"], Counter())[record.get("tenant") or ""] += 1
    return counts


def audit_problems(
    counts: dict[str, Counter[str]], sent: Counter[str], ok: Counter[str]
) -> list[str]:
    """`sent`, `ok`: requests sent and answered 200, per tenant."""
    problems = []
    for tenant, n in sorted(sent.items()):
        terminal = sum(counts.get(kind, Counter())[tenant] for kind in TERMINAL)
        if terminal != n:
            problems.append(f"{tenant}: {n} requests but {terminal} terminal audit records")
        for kind in ("execution.started", "execution.finished"):
            if counts.get(kind, Counter())[tenant] != ok[tenant]:
                problems.append(
                    f"{tenant}: {ok[tenant]} answered 200 but "
                    f"{counts.get(kind, Counter())[tenant]} {kind} records"
                )
    return problems


def leaked_sandboxes(state_dir: Path, cgroup_root: Path, cgroup_parent: str) -> list[str]:
    """After the gateway stopped: sandbox dirs, cgroups or processes of its backend
    still on the host (blocking: call from a thread)."""
    found: list[str] = []
    runs = state_dir / "runs"  # one workspace per sandbox (backends/workspace.py)
    if runs.is_dir():
        found += [f"sandbox workspace left: {p}" for p in sorted(runs.iterdir())]
    with open("/proc/self/mounts") as mounts:
        found += [
            f"mount left: {line.split()[1]}" for line in mounts if str(state_dir) in line.split()[1]
        ]
    parent = cgroup_parent.strip("/")
    bases = [cgroup_root, *(p for p in cgroup_root.iterdir() if p.is_dir())]
    for base in bases:
        group = base / parent
        if group.is_dir():
            found += [f"cgroup left: {c}" for c in sorted(group.iterdir()) if c.is_dir()]
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cgroups = Path(entry.path, "cgroup").read_text()
            cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if f"/{parent}/" in cgroups or str(state_dir) in cmdline:
            found.append(f"process left: {entry.name} {cmdline[:80]}")
    return found


def remove_cgroup_parents(cgroup_root: Path, cgroup_parent: str) -> None:
    """The run's own (empty) parent cgroups, so repeated runs leave nothing."""
    parent = cgroup_parent.strip("/")
    for base in [cgroup_root, *(p for p in cgroup_root.iterdir() if p.is_dir())]:
        group = base / parent
        if group.is_dir():
            with contextlib.suppress(OSError):
                group.rmdir()


def summary(values: dict[str, Any]) -> str:
    return json.dumps(values, indent=2, sort_keys=True)
