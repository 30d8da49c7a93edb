"""Tracer lines -> the registered executions' recorders (no I/O: unit-testable).

The host tracer (backends/capture/host.py) feeds every line it reads to one
`Demux`, from its reader thread; each event goes to the `BehaviourRecorder` of
the execution whose sandbox pid namespace it names. Lines for namespaces
nobody registered (only in flight at a registration's end: the kernel prints
nothing for others) are dropped after reading one number.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass, field

from backends.capture.bpftrace import (
    ABSTRACT,
    AT_REMOVEDIR,
    IPC_CALLS,
    MAX_ARGS,
    OPS,
    SIGNAL_CALLS,
    STRLEN,
    Line,
    open_op,
    parse,
)
from backends.capture.record import BehaviourRecorder, ipc_name
from backends.capture.syscalls import call_name

DATA = b'"data": "'


@dataclass(eq=False)
class Capture:
    """One execution's registration with the demultiplexer."""

    ns: int
    recorder: BehaviourRecorder
    since_ns: int
    # A pid (as the sandbox names it) whose events are the sandbox's machinery,
    # not the code's (docker's launcher is PID 1); 0: none.
    skip_pid: int = 0
    execs: dict[int, tuple[str, list[str]]] = field(default_factory=dict)
    renames: dict[int, str] = field(default_factory=dict)
    waiting: set[int] = field(default_factory=set)
    # CPUs the end barrier could not mark (their events are not proven read).
    unmarked: set[int] = field(default_factory=set)
    # A descriptor of the pid namespace, held while registered: the kernel gives a
    # freed namespace's number to the next one made, and `ns` must stay this
    # execution's until its end (host.HostTracer closes it); -1: none held.
    held: int = -1
    done: asyncio.Event = field(default_factory=asyncio.Event)
    # The loop that awaits `done` (the reader thread wakes it through it); None:
    # set directly (no other thread involved).
    loop: asyncio.AbstractEventLoop | None = None

    def complete(self) -> None:
        """Wake whoever waits for this record's end, from any thread."""
        if self.loop is None:
            self.done.set()
            return
        with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits
            self.loop.call_soon_threadsafe(self.done.set)


def _text(value: str) -> str:
    """A path or argument as the tracer read it: "?" when it could not be read
    (not paged in), marked when bpftrace's string limit cut it."""
    if not value:
        return "?"
    if len(value.encode("utf-8", "surrogateescape")) >= STRLEN - 1:
        return value + "…"
    return value


class Demux:
    """Tracer lines -> the registered executions' recorders (no I/O: unit-testable)."""

    def __init__(
        self, names: dict[int, str] | None = None, names32: dict[int, str] | None = None
    ) -> None:
        self.names = names or {}
        self.names32 = names32 or {}
        self.captures: dict[int, Capture] = {}
        self.lines = 0
        self.discarded = 0

    def register(self, capture: Capture) -> None:
        self.captures[capture.ns] = capture

    def unregister(self, capture: Capture) -> None:
        if self.captures.get(capture.ns) is capture:
            del self.captures[capture.ns]
        for path, argv in capture.execs.values():
            # No result seen: the exec replaced a thread other than the leader.
            capture.recorder.program(path, argv, 0)
        capture.execs.clear()

    def feed(self, raw: bytes) -> None:
        self.lines += 1
        start = raw.find(DATA)
        if start < 0:
            self._other(raw)
            return
        start += len(DATA)
        end = raw.find(b" ", start + 2)
        try:
            ns = int(raw[start + 2 : end])
        except ValueError:
            return
        capture = self.captures.get(ns)
        if capture is None:
            self.discarded += 1
            return
        try:
            data = json.loads(raw)["data"]
        except (ValueError, KeyError, TypeError):
            return
        line = parse(data)
        if line is not None:
            self.event(capture, line)

    def _other(self, raw: bytes) -> None:
        try:
            record = json.loads(raw)
        except ValueError:
            return
        if isinstance(record, dict) and record.get("type") == "lost_events":
            lost = int((record.get("data") or {}).get("events", 0))
            # Whose they were is unknown: every execution running may have lost them.
            for capture in self.captures.values():
                capture.recorder.dropped += lost

    def event(self, capture: Capture, line: Line) -> None:
        kind, pid, values = line.kind, line.pid, line.fields
        if kind == "b":
            if pid not in capture.waiting:  # the CPU, for a barrier
                # Not this record's: a late line of the number's earlier holder (its
                # end timed out), or a repeat. Its count was that holder's too.
                return
            capture.recorder.dropped += values[0]
            capture.waiting.discard(pid)
            if not capture.waiting:
                capture.complete()
            return
        if kind == "z":
            capture.recorder.dropped += values[0]
            return
        if line.nsecs < capture.since_ns or pid == capture.skip_pid:
            return
        recorder = capture.recorder
        if kind == "f":
            code, flags, ret = values
            op = OPS.get(code, "open")
            path = _text(line.text)
            if op == "open":
                op = open_op(flags)
            elif op == "unlink" and flags & AT_REMOVEDIR:
                op = "rmdir"
            elif op == "rename":
                path = f"{path} -> {capture.renames.pop(pid, '?')}"
            elif op == "connect" and flags & ABSTRACT:
                # As long as the address said (the tracer read on to a NUL).
                name = line.text.encode("utf-8", "surrogateescape")[: max(flags >> 8, 0)]
                path = "@" + name.decode("utf-8", "replace")
            recorder.file(op, path, ret)
        elif kind == "g":
            capture.renames[pid] = _text(line.text)
        elif kind == "x":
            if pid in capture.execs:
                path, argv = capture.execs.pop(pid)
                recorder.program(path, argv, 0)
            capture.execs[pid] = (_text(line.text), [])
        elif kind == "a":
            pending = capture.execs.get(pid)
            if pending is not None and len(pending[1]) < MAX_ARGS:
                pending[1].append(line.text if line.text else "")
        elif kind == "X":
            pending = capture.execs.pop(pid, None)
            if pending is not None:
                recorder.program(pending[0], pending[1], values[0])
        elif kind == "s":
            code, target, sig, ret = values
            recorder.signal(SIGNAL_CALLS.get(code, "?"), target, sig, ret)
        elif kind == "k":
            code, key, ret = values
            recorder.file("ipc", ipc_name(IPC_CALLS.get(code, "?"), key), ret)
        elif kind == "r":
            recorder.refused(self.call_name(values[0]))

    def call_name(self, number: int) -> str:
        """A refused call's name: x86-64's, or marked x32 or i386 (int 0x80)."""
        return call_name(number, self.names, self.names32)
