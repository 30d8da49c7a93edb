"""Seccomp refusals, named, from the kernel log (nsjail `--seccomp_log`).

With SECCOMP_FILTER_FLAG_LOG every refused system call becomes a kernel audit
record (type=1326) with the caller's host pid and the syscall number; without
auditd it reaches /dev/kmsg (rate-limited by the kernel, so best effort). The
watcher reads /dev/kmsg on the event loop and attributes each record to the
sandbox whose cgroup holds that pid, while the process still exists.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import re
from pathlib import Path

from backends.base import SandboxEvent
from backends.capture.syscalls import syscall_names

__all__ = ["SeccompWatcher", "syscall_names"]

RECORD = re.compile(rb"type=1326 .*?\bpid=(\d+) .*?\bsyscall=(\d+)\b")
# Distinct syscalls named per execution; the rest are counted.
MAX_NAMED = 32
BATCH = 256


class SeccompWatcher:
    def __init__(self, names: dict[int, str]) -> None:
        self.names = names
        self._fd = -1
        self._loop: asyncio.AbstractEventLoop | None = None
        # sandbox name (a unique cgroup path component) -> syscall -> count
        self._watched: dict[str, collections.Counter[str]] = {}

    def start(self) -> None:
        """Follow the kernel log from now on (needs root; call on the loop)."""
        self._fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        os.lseek(self._fd, 0, os.SEEK_END)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._fd, self.drain)

    def close(self) -> None:
        if self._fd >= 0:
            if self._loop is not None:
                self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1

    def watch(self, sandbox: str) -> None:
        self._watched[sandbox] = collections.Counter()

    def events(self, sandbox: str) -> tuple[SandboxEvent, ...]:
        """Stop watching `sandbox`; its refusals so far, one event per syscall."""
        self.drain()
        counts = self._watched.pop(sandbox, collections.Counter())
        named = counts.most_common(MAX_NAMED)
        events = [SandboxEvent("seccomp", f"{name} refused ({n}x)") for name, n in named]
        rest = sum(counts.values()) - sum(n for _, n in named)
        if rest:
            events.append(SandboxEvent("seccomp", f"{rest} more refusals of other syscalls"))
        return tuple(events)

    def drain(self) -> None:
        for _ in range(BATCH):
            try:
                record = os.read(self._fd, 8192)
            except BlockingIOError:
                return
            except BrokenPipeError:
                continue  # records were overwritten before we read them
            except OSError:
                return
            match = RECORD.search(record)
            if match is None or not self._watched:
                continue
            pid, number = int(match[1]), int(match[2])
            owner = self._owner(pid)
            if owner is not None:
                self._watched[owner][self.names.get(number, f"syscall {number}")] += 1

    def _owner(self, pid: int) -> str | None:
        with contextlib.suppress(OSError):
            cgroups = Path(f"/proc/{pid}/cgroup").read_text()
            for sandbox in self._watched:
                if f"/{sandbox}\n" in cgroups or f"/{sandbox}/" in cgroups:
                    return sandbox
        return None
