"""Marker calls: how the gateway speaks to its host tracer through the kernel.

A marker is a getpriority(2) call with a `which` no kernel knows: it fails at once
(EINVAL) and only the tracer's probe notices it. A barrier is one marker on every
CPU: the events of one CPU come out of its perf buffer in order, so once the tracer
has printed a CPU's barrier marker, every event that CPU saw before it has been read.

The barrier's markers are made by threads pinned one to each CPU when the tracer
starts, fed through a queue: the loop pays one `put` per CPU and each CPU one thread
wake-up. Moving a single thread across every CPU instead (a `sched_setaffinity`, so
a migration, per CPU, on a thread of its own) took 0.55-1.0 ms per execution here.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import queue
import threading
from collections.abc import Callable

from backends.capture.bpftrace import BARRIER_WHICH

log = logging.getLogger(__name__)

PIN_TIMEOUT_S = 5.0
JOIN_TIMEOUT_S = 5.0


def _who(ns: int) -> int:
    """A namespace inode as getpriority's `who` (the tracer reads it back unsigned)."""
    return ns - 2**32 if ns >= 2**31 else ns


def mark(which: int, ns: int) -> None:
    """One marker call (blocking, microseconds): EINVAL, only the tracer notices."""
    with contextlib.suppress(OSError):
        os.getpriority(which, _who(ns))


def online_cpus() -> list[int]:
    try:
        with open("/sys/devices/system/cpu/online") as f:
            text = f.read().strip()
    except OSError:
        return sorted(os.sched_getaffinity(0))
    cpus: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus += range(int(low), int(high or low) + 1)
    return cpus


class CpuMarkers:
    """One pinned thread per CPU that makes the barrier's marker on it.

    `missed(ns, cpu)` is called (from that CPU's thread) when a marker could not be
    made on its CPU: the thread was moved off it and cannot go back (a cpuset
    changed under the gateway), so the caller stops waiting for that CPU's marker.
    """

    def __init__(self, missed: Callable[[int, int], None]) -> None:
        self._missed = missed
        self._queues: dict[int, queue.SimpleQueue[int | None]] = {}
        self._threads: dict[int, threading.Thread] = {}

    @property
    def cpus(self) -> frozenset[int]:
        """The CPUs a barrier marks: those a thread could be pinned to at start."""
        return frozenset(self._queues)

    @property
    def threads(self) -> dict[int, threading.Thread]:
        """Each marked CPU's thread."""
        return dict(self._threads)

    def start(self, cpus: list[int]) -> None:
        """A pinned thread for each CPU of `cpus` this process may run on (blocking,
        briefly: each thread says whether it could pin itself)."""
        for cpu in cpus:
            line: queue.SimpleQueue[int | None] = queue.SimpleQueue()
            pinned: concurrent.futures.Future[bool] = concurrent.futures.Future()
            thread = threading.Thread(
                target=self._serve, args=(cpu, line, pinned),
                name=f"execgate-marker-{cpu}", daemon=True,
            )  # fmt: skip
            thread.start()
            try:
                ok = pinned.result(timeout=PIN_TIMEOUT_S)
            except concurrent.futures.TimeoutError:
                ok = False
            if ok:
                self._queues[cpu] = line
                self._threads[cpu] = thread
            else:
                line.put(None)  # outside this process's cpuset (or never started)

    def barrier(self, ns: int) -> frozenset[int]:
        """Queue the barrier marker for `ns` on every CPU (non-blocking: safe on
        the event loop); returns the CPUs whose marker the tracer will print."""
        for line in self._queues.values():
            line.put(ns)
        return self.cpus

    def close(self) -> None:
        """Stop the threads (blocking, bounded)."""
        for line in self._queues.values():
            line.put(None)
        for thread in self._threads.values():
            thread.join(timeout=JOIN_TIMEOUT_S)
        self._queues = {}
        self._threads = {}

    def _serve(
        self, cpu: int, line: queue.SimpleQueue[int | None], pinned: concurrent.futures.Future[bool]
    ) -> None:
        try:
            self.pin(cpu)
        except OSError:
            pinned.set_result(False)
            return
        pinned.set_result(True)
        while (ns := line.get()) is not None:
            try:
                self.pin(cpu)
            except OSError as exc:
                log.warning("capture: cannot mark CPU %d any more: %s", cpu, exc)
                self._missed(ns, cpu)
                continue
            mark(BARRIER_WHICH, ns)

    def pin(self, cpu: int) -> None:
        """Keep the calling thread on `cpu` alone (raises OSError if it may not run
        there). Checked before each marker too: only an outside change to the
        gateway's affinity or cpuset moves a pinned thread, and a marker made on
        another CPU would prove nothing about this one."""
        if os.sched_getaffinity(0) != {cpu}:
            os.sched_setaffinity(0, {cpu})
