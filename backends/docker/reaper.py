"""Who owns a sandbox container, and removing those whose owner is gone.

Every container carries labels naming its gateway instance: the host, the pid and
that process's start time (so a recycled pid is not mistaken for its owner), and
the execution when it is known at creation. A gateway killed mid-execution leaves
containers behind (its containers made ahead exit by themselves when its attach
connections drop; a running one stops at the launcher's own deadline); the next
gateway on the host removes them at start-up, and every instance removes leftovers
periodically. Containers of instances on other hosts are theirs to reap.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.base import BackendError
from backends.docker.engine import Engine

log = logging.getLogger(__name__)

LABEL_INSTANCE = "execgate.instance"
LABEL_BACKEND = "execgate.backend"
LABEL_HOST = "execgate.host"
LABEL_PID = "execgate.pid"
LABEL_PID_START = "execgate.pid_start"
LABEL_EXECUTION = "execgate.execution"


def process_start(pid: int) -> str:
    """The process's start time in clock ticks since boot ("" if it does not exist)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    # The command name may contain spaces and parentheses: fields follow the last ")".
    return stat.rsplit(")", 1)[-1].split()[19]


@dataclass(frozen=True, slots=True)
class Instance:
    id: str
    host: str
    pid: int
    pid_start: str

    @classmethod
    def current(cls) -> Instance:
        pid = os.getpid()
        token = secrets.token_hex(4)
        return cls(f"{pid}-{token}", socket.gethostname(), pid, process_start(pid))

    @property
    def name_prefix(self) -> str:
        return f"execgate-{self.id}"

    def labels(self, backend: str, execution_id: str = "") -> dict[str, str]:
        labels = {
            LABEL_INSTANCE: self.id,
            LABEL_BACKEND: backend,
            LABEL_HOST: self.host,
            LABEL_PID: str(self.pid),
            LABEL_PID_START: self.pid_start,
        }
        if execution_id:
            labels[LABEL_EXECUTION] = execution_id
        return labels


def owner_alive(labels: dict[str, str], host: str) -> bool:
    """False only when the owning gateway ran on this host and is gone."""
    if labels.get(LABEL_HOST) != host:
        return True
    try:
        pid = int(labels.get(LABEL_PID, ""))
    except ValueError:
        return False
    start = process_start(pid)
    return bool(start) and start == labels.get(LABEL_PID_START)


async def reap(engine: Engine, instance: Instance, keep_own: Callable[[str], bool]) -> list[str]:
    """Remove containers of dead instances on this host, and this instance's own
    containers that `keep_own(name)` does not claim. Returns their names."""
    found = await engine.containers(LABEL_INSTANCE)
    # Liveness is read from /proc: off the event loop.
    stale = await asyncio.to_thread(_stale, found, instance, keep_own)
    gone = []
    for cid, name in stale:
        try:
            await engine.remove(cid)
        except BackendError as exc:
            log.error("docker: cannot remove leftover container %s: %s", name, exc)
            continue
        gone.append(name)
    if gone:
        log.warning("docker: removed %d leftover sandbox containers", len(gone))
    return gone


def _stale(
    found: list[dict[str, Any]], instance: Instance, keep_own: Callable[[str], bool]
) -> list[tuple[str, str]]:
    stale = []
    for item in found:
        labels = item.get("Labels") or {}
        name = (item.get("Names") or ["?"])[0].lstrip("/")
        if labels.get(LABEL_INSTANCE) == instance.id:
            if keep_own(name):
                continue
        elif owner_alive(labels, instance.host):
            continue
        stale.append((str(item["Id"]), name))
    return stale
