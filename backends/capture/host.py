"""Behaviour capture on the host kernel (nsjail, docker with runc): one bpftrace.

One long-lived tracer per backend instance (backends/capture/bpftrace.py has its
program), started with the backend and stopped with it. Its JSON lines are read
on the event loop in chunks and handed to `Demux`, which sends each event to the
`BehaviourRecorder` of the execution whose sandbox pid namespace it names; lines
for namespaces nobody registered (sandboxes waiting in a pool, other gateways'
sandboxes, other containers) are dropped after reading one number.

A sandbox is registered when an execution claims it (pid namespace inode of its
first process, and the time: anything the sandbox did before the claim is not
the execution's), and finished after everything in it is dead: the gateway then
makes a marker call on every CPU it can run on, and the record is complete once
the tracer has printed each marker (events of one CPU come out in order, so
every event before the sandbox died has been read). What the runtime does on
its own at start-up is learnt per language from a do-nothing run (`learn`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from backends.base import BackendError
from backends.capture.bpftrace import (
    AT_REMOVEDIR,
    BARRIER_WHICH,
    MAP_KEYS,
    MAX_ARGS,
    OPS,
    SIGNAL_CALLS,
    STRLEN,
    Line,
    open_op,
    parse,
    program,
    refusable_calls,
)
from backends.capture.record import Baseline, Behaviour, BehaviourRecorder, capture_off
from backends.capture.settings import CaptureSettings
from backends.capture.syscalls import syscall_names

log = logging.getLogger(__name__)

TRACER = "bpftrace"
TRACEFS = Path("/sys/kernel/tracing")
BTF = Path("/sys/kernel/btf/vmlinux")
# Events printed per sandbox; past it the kernel only counts (reported as dropped).
KERNEL_CAP = 8192
# Per-CPU perf buffer pages: room for a burst while the gateway is busy.
PERF_PAGES = 1024
START_TIMEOUT_S = 120.0
BARRIER_TIMEOUT_S = 5.0
# A fresh sandbox's init may take a while to wait for its launch line under load.
IDLE_TIMEOUT_S = 30.0
LEARN_ATTEMPTS = 3
CHUNK = 1 << 16
DATA = b'"data": "'
# A program that does next to nothing (an empty line out), per language: its
# record is the runtime's baseline.
DO_NOTHING = {"bash": "echo", "python": "print()", "javascript": "console.log()"}


class CaptureUnavailable(Exception):
    """Why this host cannot capture (the message is the reason results show)."""


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
    done: asyncio.Event = field(default_factory=asyncio.Event)


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

    def __init__(self, names: dict[int, str] | None = None) -> None:
        self.names = names or {}
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
            capture.recorder.dropped += values[0]
            capture.waiting.discard(pid)  # the CPU, for a barrier
            if not capture.waiting:
                capture.done.set()
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
        elif kind == "r":
            number = values[0]
            recorder.refused(self.names.get(number, f"syscall {number}"))


def _refusable() -> list[str]:
    """The calls the policy may refuse that this kernel has tracepoints for (blocking);
    not those whose arguments bpftrace 0.17 cannot declare (enum types)."""
    events = TRACEFS / "events" / "syscalls"
    names = []
    for entry in os.listdir(events):
        if entry.startswith("sys_enter_"):
            with contextlib.suppress(OSError):
                if "enum " not in (events / entry / "format").read_text():
                    names.append(entry[len("sys_enter_") :])
    return refusable_calls(names)


def pid_level(pid: int | str = "self") -> int:
    """How deep `pid`'s pid namespace is, as this process sees it (NSpid entries)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return len(line.split()) - 2
    raise OSError(f"/proc/{pid}/status has no NSpid line")


def pid_namespace(pid: int) -> int:
    return os.stat(f"/proc/{pid}/ns/pid").st_ino


def online_cpus() -> list[int]:
    try:
        text = Path("/sys/devices/system/cpu/online").read_text().strip()
    except OSError:
        return sorted(os.sched_getaffinity(0))
    cpus: list[int] = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        cpus += range(int(low), int(high or low) + 1)
    return cpus


def emit_barrier(ns: int, cpus: list[int]) -> set[int]:
    """The marker call for `ns` on each CPU this thread may run on (blocking; the
    calling thread's affinity is restored). Returns the CPUs marked."""
    who = ns - 2**32 if ns >= 2**31 else ns
    original = os.sched_getaffinity(0)
    marked: set[int] = set()
    try:
        for cpu in cpus:
            try:
                os.sched_setaffinity(0, {cpu})
            except OSError:
                continue  # outside this process's cpuset
            with contextlib.suppress(OSError):
                os.getpriority(BARRIER_WHICH, who)  # EINVAL: only the tracer notices
            marked.add(cpu)
    finally:
        os.sched_setaffinity(0, original)
    return marked


def prerequisites(settings: CaptureSettings) -> tuple[str, int]:
    """(the tracer binary, the gateway's pid namespace level); raises
    CaptureUnavailable with the reason (blocking: may mount tracefs)."""
    if os.geteuid() != 0:
        raise CaptureUnavailable("the gateway is not root (BPF tracing needs it)")
    tracer = settings.tracer_path or shutil.which(TRACER) or ""
    if not tracer or not os.access(tracer, os.X_OK):
        name = settings.tracer_path or TRACER
        raise CaptureUnavailable(f"{name} not found (Debian: apt install bpftrace)")
    if not BTF.exists():
        raise CaptureUnavailable(f"the kernel has no BTF ({BTF})")
    if not (TRACEFS / "events").is_dir():
        # Debian's bpftrace looks for tracepoints here; mounted once, host-wide.
        done = subprocess.run(
            ["mount", "-t", "tracefs", "tracefs", str(TRACEFS)],
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        if done.returncode != 0 or not (TRACEFS / "events").is_dir():
            raise CaptureUnavailable(f"tracefs is not mounted at {TRACEFS}: {done.stderr.strip()}")
    if not (TRACEFS / "events" / "syscalls").is_dir():
        raise CaptureUnavailable("the kernel has no system-call tracepoints")
    return tracer, pid_level()


_PR_SET_PDEATHSIG = 1
_LIBC = ctypes.CDLL(None, use_errno=True)


def _dies_with(parent: int) -> Callable[[], None]:
    """For the tracer's child: detach (SIGINT) when the gateway dies, even by SIGKILL,
    so no tracer outlives the gateway that reads it."""

    def child() -> None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGINT)
        if os.getppid() != parent:  # the gateway died before prctl took effect
            os._exit(1)

    return child


class HostTracer:
    """The bpftrace process and its reader."""

    def __init__(self, settings: CaptureSettings) -> None:
        self.settings = settings
        self.demux = Demux()
        self.level = 0
        self.problem = "not started"
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._stderr: asyncio.Task[None] | None = None
        self._errors = bytearray()
        self._cpus: list[int] = []
        self._closing = False

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None and not self.problem

    async def start(self) -> None:
        tracer, self.level = await asyncio.to_thread(prerequisites, self.settings)
        self.demux.names = await asyncio.to_thread(syscall_names)
        self._cpus = online_cpus()
        env = {
            "PATH": "/usr/bin:/bin:/usr/sbin:/sbin",
            "BPFTRACE_STRLEN": str(STRLEN),
            "BPFTRACE_MAP_KEYS_MAX": str(MAP_KEYS),
            "BPFTRACE_PERF_RB_PAGES": str(PERF_PAGES),
        }
        script = program(self.level, KERNEL_CAP, await asyncio.to_thread(_refusable))
        try:
            self._proc = await asyncio.create_subprocess_exec(
                tracer, "-q", "-f", "json", "-B", "line", "-e", script,
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True,
                preexec_fn=_dies_with(os.getpid()),
            )  # fmt: skip
        except OSError as exc:
            raise CaptureUnavailable(f"cannot start {tracer}: {exc}") from exc
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._stderr = asyncio.ensure_future(self._drain_stderr(self._proc.stderr))
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                first = await self._proc.stdout.readline()
        except TimeoutError:
            first = b""
        if b'"ready' not in first:
            await self.close()
            raise CaptureUnavailable(f"{tracer} did not attach: {self._error_text()}")
        self.problem = ""
        self._reader = asyncio.ensure_future(self._read(self._proc.stdout))

    def _error_text(self) -> str:
        lines = [
            line
            for line in bytes(self._errors).decode(errors="replace").splitlines()
            if "RLIMIT_MEMLOCK" not in line and line.strip()
        ]
        return " | ".join(lines[-3:])[-500:] or "no message"

    async def _drain_stderr(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(4096):
            self._errors += chunk
            del self._errors[:-4096]

    async def _read(self, stream: asyncio.StreamReader) -> None:
        pending = b""
        while chunk := await stream.read(CHUNK):
            *lines, pending = (pending + chunk).split(b"\n")
            for raw in lines:
                self.demux.feed(raw)
        # The tracer went away: nothing more will come for anyone.
        if not self._closing:
            self.problem = f"the tracer exited: {self._error_text()}"
            log.error("capture: %s", self.problem)
        for capture in list(self.demux.captures.values()):
            capture.done.set()

    def register(self, pid: int, recorder: BehaviourRecorder, skip_pid: int = 0) -> Capture:
        """Start attributing the events of `pid`'s pid namespace (blocking: /proc)."""
        if pid_level(pid) != self.level + 1:
            raise CaptureUnavailable("the sandbox's pid namespace is not a child of the gateway's")
        capture = Capture(pid_namespace(pid), recorder, time.monotonic_ns(), skip_pid)
        self.demux.register(capture)
        return capture

    async def finish(self, capture: Capture) -> Behaviour:
        """The record, once every event before now has been read (call it after
        everything in the sandbox is dead)."""
        incomplete = ""
        if self.running:
            capture.waiting = set(self._cpus)
            marked = await asyncio.to_thread(emit_barrier, capture.ns, self._cpus)
            capture.waiting &= marked
            if not marked:
                incomplete = "incomplete: no CPU could be marked"
            elif not capture.waiting:
                capture.done.set()
            try:
                async with asyncio.timeout(BARRIER_TIMEOUT_S):
                    await capture.done.wait()
            except TimeoutError:
                incomplete = "incomplete: the tracer did not confirm the end in time"
        self.demux.unregister(capture)
        if self.problem:
            return capture_off(self.problem)
        behaviour = capture.recorder.finish()
        if incomplete:
            behaviour = dataclasses.replace(behaviour, reason=incomplete)
        return behaviour

    def discard(self, capture: Capture) -> None:
        self.demux.unregister(capture)

    async def close(self) -> None:
        self._closing = True
        proc = self._proc
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)  # bpftrace detaches its probes
            try:
                async with asyncio.timeout(10):
                    await proc.wait()
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        for task in (self._reader, self._stderr):
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._reader = self._stderr = None
        self._proc = None
        self.problem = "stopped"


class HostCapture:
    """What a backend on the host kernel holds for capture: the tracer, the
    per-language baselines, whether capture is on and why not."""

    def __init__(self, settings: CaptureSettings, backend: str) -> None:
        self.settings = settings
        self.backend = backend
        self.tracer: HostTracer | None = None
        self.reason = "disabled in config" if not settings.enabled else "not started"
        self.baselines: dict[str, Baseline] = {}

    def status(self) -> tuple[bool, str]:
        if self.tracer is not None and self.tracer.running:
            return True, ""
        if self.tracer is not None and self.tracer.problem:
            return False, self.tracer.problem
        return False, self.reason

    def health_problem(self) -> str:
        """A reason to be unhealthy: capture is required and off."""
        on, why = self.status()
        if self.settings.required and not on:
            return f"behaviour capture is required and off: {why}"
        return ""

    async def start(self) -> None:
        """Start the tracer; with `required`, raise BackendError when it cannot."""
        if not self.settings.enabled or self.tracer is not None:
            return
        tracer = HostTracer(self.settings)
        try:
            await tracer.start()
        except CaptureUnavailable as exc:
            self.reason = str(exc)
            log.warning("%s: behaviour capture is off: %s", self.backend, exc)
            if self.settings.required:
                raise BackendError(f"behaviour capture is required: {exc}") from exc
            return
        self.tracer = tracer
        self.reason = ""

    async def close(self) -> None:
        if self.tracer is not None:
            await self.tracer.close()
            self.tracer = None
            self.reason = "stopped"
        self.baselines.clear()

    def recorder(self, language: str) -> BehaviourRecorder:
        s = self.settings
        return BehaviourRecorder(
            tracer=TRACER,
            baseline=self.baselines.get(language, Baseline()),
            max_files=s.max_files,
            max_programs=s.max_programs,
            max_signals=s.max_signals,
            max_bytes=s.max_bytes,
        )

    async def begin(self, pid: int, language: str, skip_pid: int = 0) -> Capture | str:
        """Register a claimed sandbox (its first process); the reason capture is
        off for this execution otherwise."""
        on, why = self.status()
        if not on or self.tracer is None:
            return why
        tracer = self.tracer
        try:
            return await asyncio.to_thread(tracer.register, pid, self.recorder(language), skip_pid)
        except (OSError, CaptureUnavailable) as exc:
            return f"cannot follow this sandbox: {exc}"

    async def end(self, capture: Capture | str) -> Behaviour:
        if isinstance(capture, str):
            return capture_off(capture)
        if self.tracer is None:
            return capture_off(self.reason or "stopped")
        return await self.tracer.finish(capture)

    def drop(self, capture: Capture | str | None) -> None:
        """Stop attributing without a record (the execution failed)."""
        if isinstance(capture, Capture) and self.tracer is not None:
            self.tracer.discard(capture)

    async def learn(
        self,
        language: str,
        seen: Behaviour | None,
        again: Callable[[], Awaitable[Behaviour | None]],
    ) -> None:
        """What a do-nothing program did in this language is the runtime's own:
        from `seen`, or, when that run was not followed, from another (`again`)."""
        for _ in range(LEARN_ATTEMPTS):
            if not self.status()[0]:
                return
            if seen is not None and seen.capture == "on":
                self.baselines[language] = Baseline.learn(seen)
                return
            seen = await again()
        log.warning("%s: no %s baseline learnt: %s", self.backend, language, seen)


def idle_child(pid: int, timeout_s: float = IDLE_TIMEOUT_S) -> int:
    """The first child of `pid` (a jail's init) once it has become its own program
    and waits in read(2) (blocking, bounded): what it did until then, whether the
    sandbox was made ahead or just now, is the jail's set-up, not the execution's."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(OSError, ValueError, IndexError):
            child = int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])
            # Read each time: a sandbox made just now may still be its shell shim.
            if (
                os.readlink(f"/proc/{child}/exe") != os.readlink(f"/proc/{pid}/exe")
                and Path(f"/proc/{child}/syscall").read_text().split()[0] == "0"
            ):
                return child
        if time.monotonic() > deadline:
            seen = ""
            with contextlib.suppress(OSError, ValueError, IndexError):
                child = int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])
                seen = (
                    f" (init {child}: {os.readlink(f'/proc/{child}/exe')},"
                    f" in {Path(f'/proc/{child}/syscall').read_text().split()[0]})"
                )
            raise OSError(
                f"the sandbox of process {pid} is not waiting after {timeout_s:.0f} s{seen}"
            )
        time.sleep(0.001)
