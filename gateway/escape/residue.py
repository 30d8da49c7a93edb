"""What a finished execution may not leave on the host, asked of each backend.

nsjail: no process of the sandbox uid outside the sandboxes waiting in the pool
or running an execution. docker (and docker-gvisor): no container of this backend
instance but those waiting or running. A backend without such a notion has no residue check.
Any backend: no egress boundary device (backends/egress/) in the gateway's own namespace.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from backends.base import SandboxBackend
from backends.egress.boundary import TUN_NAME


async def leftovers(backend: SandboxBackend) -> list[str]:
    found = await _sandbox_leftovers(backend)
    # /sys/class/net shows the namespace sysfs was mounted in: the host's.
    if await asyncio.to_thread(Path(f"/sys/class/net/{TUN_NAME}").exists):
        found.append(f"network device {TUN_NAME} in the gateway's own network namespace")
    return found


async def _sandbox_leftovers(backend: SandboxBackend) -> list[str]:
    found = await _sandbox_leftovers_once(backend)
    if not found:
        return found
    # A sandbox the pool was making while /proc was read (under load that read is
    # slow) is no residue: only what is still there, and still no sandbox's, after
    # the backend settles again is reported. A leaked process stays; one that exited
    # meanwhile left nothing behind.
    return sorted(set(found) & set(await _sandbox_leftovers_once(backend)))


async def _sandbox_leftovers_once(backend: SandboxBackend) -> list[str]:
    settle = getattr(backend, "wait_settled", None)
    if settle is not None:
        try:
            await settle()
        except TimeoutError:
            return ["sandboxes still being made or disposed of after the wait"]
    # Waiting in the pool, or running someone's execution (the self-test runs
    # beside live traffic): neither is residue.
    ready = getattr(backend, "ready_sandboxes", frozenset()) | getattr(
        backend, "running_sandboxes", frozenset()
    )
    containers = getattr(backend, "own_containers", None)
    if containers is not None:
        extra = await containers() - set(ready)
        return [f"container left behind: {name}" for name in sorted(extra)]
    settings = getattr(backend, "settings", None)
    uid = getattr(settings, "sandbox_uid", None)
    prefix = getattr(backend, "instance_prefix", None)
    if uid is None or prefix is None:
        return []
    parent = "/" + str(getattr(settings, "cgroup_parent", "execgate")).strip("/") + "/"
    strays = await asyncio.to_thread(_processes_outside, uid, frozenset(ready), prefix, parent)
    return [f"process {pid} ({name}) of the sandbox uid left behind, in {where}"
            for pid, name, where in strays]  # fmt: skip


def _processes_outside(
    uid: int, keep: frozenset[str], prefix: str, parent: str
) -> list[tuple[int, str, str]]:
    """Processes of the sandbox uid in a finished sandbox of this instance, or in
    no sandbox cgroup at all. Another gateway's sandboxes (same uid, own prefix)
    are that gateway's business."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            status = Path(entry.path, "status").read_text()
            cgroup = Path(entry.path, "cgroup").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if uid not in {int(u) for u in fields.get("Uid", "").split()}:
            continue
        # A killed sandbox process that its new parent has not reaped yet: dead, it
        # runs nothing and holds nothing, and the kernel lists it in the root cgroup.
        if fields.get("State", "").strip()[:1] in ("Z", "X") or _exiting(entry.path):
            continue
        paths = [line.split(":", 2)[-1] for line in cgroup.splitlines()]
        names = {path.rsplit("/", 1)[-1] for path in paths}
        if names & keep:
            continue
        ours = any(name.startswith(prefix) for name in names)
        in_a_sandbox = any(parent in path + "/" for path in paths)
        if ours or not in_a_sandbox:
            where = ",".join(sorted(set(paths))) or "no cgroup"
            found.append((int(entry.name), fields.get("Name", "").strip(), where))
    return found


PF_EXITING = 0x4


def _exiting(proc_dir: str) -> bool:
    """Killed and on its way out: the kernel has already moved it to the root cgroup."""
    try:
        stat = Path(proc_dir, "stat").read_text()
    except OSError:
        return True  # gone
    flags = int(stat.rsplit(")", 1)[1].split()[6])
    return bool(flags & PF_EXITING)
