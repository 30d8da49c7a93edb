"""Behaviour capture on the host kernel (nsjail, docker with runc): one bpftrace.

One long-lived tracer per gateway process (backends/capture/bpftrace.py has its
program), shared by every backend on the host kernel through a `TracerHub`: the
kernel probes are host-wide, so a second tracer would only double the cost of
every system call and of start-up (~11 s of CPU to attach). Its JSON lines are
read by a thread of its own (so the tracer belongs to no event loop) and handed
to `Demux` (backends/capture/demux.py), which sends each event to the
`BehaviourRecorder` of the execution whose sandbox pid namespace it names.

A sandbox is registered when an execution claims it (pid namespace inode of its
first process, and the time: anything the sandbox did before the claim is not
the execution's), in user space and in the kernel (a marker call: the kernel
prints nothing for namespaces not registered), and finished after everything in
it is dead: the gateway then makes a marker call on every CPU it can run on
(backends/capture/markers.py: a thread pinned to each), and the record is
complete once the tracer has printed each marker (events of one CPU come out in
order, so every event before the sandbox died has been read). What the runtime
does on its own at start-up is learnt per language from a do-nothing run (`learn`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ctypes
import dataclasses
import functools
import logging
import os
import select
import shutil
import signal
import subprocess
import threading
import time
import typing
from collections.abc import Awaitable, Callable
from pathlib import Path

from backends.base import BackendError
from backends.capture.bpftrace import (
    MAP_KEYS,
    REGISTER_WHICH,
    STRLEN,
    UNREGISTER_WHICH,
    program,
    refusable_calls,
)
from backends.capture.demux import Capture, Demux
from backends.capture.markers import CpuMarkers, mark, online_cpus
from backends.capture.record import KINDS, Baseline, Behaviour, BehaviourRecorder, capture_off
from backends.capture.settings import CaptureSettings
from backends.capture.syscalls import UNISTD_32, syscall_names

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
# Between two looks at a sandbox still starting (idle_child): a quarter of the time
# waited so far, within these bounds. Under load a claim waits ~50 ms for a sandbox
# still starting, and each look takes the GIL from the executions: looking every
# millisecond cost ~2.5 ms of the machine's CPU per execution at concurrency 4.
IDLE_LOOK_S = 0.001
IDLE_LOOK_MAX_S = 0.004
LEARN_ATTEMPTS = 3
CHUNK = 1 << 16
# A program that does next to nothing (an empty line out), per language: its
# record is the runtime's baseline.
DO_NOTHING = {"bash": "echo", "python": "print()", "javascript": "console.log()"}


class CaptureUnavailable(Exception):
    """Why this host cannot capture (the message is the reason results show)."""


def _tracepoints() -> list[str]:
    """The system calls this kernel has tracepoints for (blocking); not those whose
    arguments bpftrace 0.17 cannot declare (enum types)."""
    events = TRACEFS / "events" / "syscalls"
    names = []
    for entry in os.listdir(events):
        if entry.startswith("sys_enter_"):
            with contextlib.suppress(OSError):
                if "enum " not in (events / entry / "format").read_text():
                    names.append(entry[len("sys_enter_") :])
    return names


def pid_level(pid: int | str = "self") -> int:
    """How deep `pid`'s pid namespace is, as this process sees it (NSpid entries)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return len(line.split()) - 2
    raise OSError(f"/proc/{pid}/status has no NSpid line")


def hold_pid_namespace(pid: int) -> tuple[int, int]:
    """`pid`'s pid namespace: (its inode number, a descriptor that keeps it). A
    namespace's number is free for the next one made once it is gone, even while
    its execution's record is still being closed (measured: 3 in 400 executions at
    concurrency 16 on nsjail were given a number still registered, and the older
    record lost its end); while the descriptor is open, no other can have it."""
    fd = os.open(f"/proc/{pid}/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.fstat(fd).st_ino, fd
    except BaseException:
        os.close(fd)
        raise


def let_go(capture: Capture) -> None:
    """Close the namespace descriptor a registration held (once; idempotent)."""
    fd, capture.held = capture.held, -1
    if fd >= 0:
        os.close(fd)


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
    """The bpftrace process and the thread that starts and reads it.

    Owned by no event loop: a thread starts the process (PR_SET_PDEATHSIG follows
    the thread that forked, so it has to be one that lives as long as the tracer)
    and reads its lines; registrations and records' ends are safe from any loop.
    """

    def __init__(
        self,
        settings: CaptureSettings,
        markers: Callable[[Callable[[int, int], None]], CpuMarkers] = CpuMarkers,
    ) -> None:
        """`markers`: makes the barrier's marker threads, given what to call for a
        CPU it cannot mark (tests hand in one whose CPUs go away)."""
        self.settings = settings
        self.demux = Demux()
        self.level = 0
        self.problem = "not started"
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._threads: list[threading.Thread] = []
        self._errors = bytearray()
        self._markers = markers(self._missed)
        self._closing = False
        # Written once by close: the reading threads stop at once, rather than at the
        # end of the tracer's exit (its output reaches EOF only after the kernel has
        # released every one of its tracepoints, ~20 s; see close_sync). Made with them.
        self._stop_r = self._stop_w = -1

    @property
    def markers(self) -> CpuMarkers:
        """The threads that make each record's end barrier, one pinned per CPU."""
        return self._markers

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None and not self.problem

    async def start(self) -> None:
        tracer, self.level = await asyncio.to_thread(prerequisites, self.settings)
        names = await asyncio.to_thread(syscall_names)
        self.demux.names = names
        self.demux.names32 = await asyncio.to_thread(syscall_names, UNISTD_32)
        tracepoints = await asyncio.to_thread(_tracepoints)
        script = program(
            self.level, KERNEL_CAP, refusable_calls(tracepoints), gateway_pid=os.getpid()
        )
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC)
        reader = threading.Thread(
            target=self._run, args=(tracer, script, ready), name="execgate-tracer", daemon=True
        )
        self._threads = [reader]
        reader.start()
        try:
            async with asyncio.timeout(START_TIMEOUT_S):
                await asyncio.wrap_future(ready)
        except (TimeoutError, CaptureUnavailable) as exc:
            await self.close()
            if isinstance(exc, CaptureUnavailable):
                raise
            raise CaptureUnavailable(f"{tracer} did not attach: {self._error_text()}") from None
        except BaseException:
            self.close_sync()  # cancelled while attaching: nothing is left running (bounded)
            raise
        await asyncio.to_thread(self._markers.start, online_cpus())
        self.problem = ""

    def _run(self, tracer: str, script: str, ready: concurrent.futures.Future[None]) -> None:
        env = {
            "PATH": "/usr/bin:/bin:/usr/sbin:/sbin",
            "BPFTRACE_STRLEN": str(STRLEN),
            "BPFTRACE_MAP_KEYS_MAX": str(MAP_KEYS),
            "BPFTRACE_PERF_RB_PAGES": str(PERF_PAGES),
        }
        try:
            proc = subprocess.Popen(
                [tracer, "-q", "-f", "json", "-B", "line", "-e", script],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=env, start_new_session=True, preexec_fn=_dies_with(os.getpid()),
            )  # fmt: skip
        except OSError as exc:
            ready.set_exception(CaptureUnavailable(f"cannot start {tracer}: {exc}"))
            return
        assert proc.stdout is not None and proc.stderr is not None
        with self._lock:
            self._proc = proc
            if self._closing:  # closed while starting
                proc.kill()
        drain = threading.Thread(
            target=self._drain_stderr, args=(proc.stderr,), name="execgate-tracer-err", daemon=True
        )
        self._threads.append(drain)
        drain.start()
        out = proc.stdout.fileno()
        pending = b""
        while b"\n" not in pending:
            chunk = self._next(out, CHUNK)
            if not chunk:
                break
            pending += chunk
        first, _, pending = pending.partition(b"\n")
        if b'"ready' not in first:
            why = f"{tracer} did not attach: {self._error_text()}"
            ready.set_exception(CaptureUnavailable(why))
            return
        ready.set_result(None)
        self._read(out, pending)

    def _error_text(self) -> str:
        lines = [
            line
            for line in bytes(self._errors).decode(errors="replace").splitlines()
            if "RLIMIT_MEMLOCK" not in line and line.strip()
        ]
        return " | ".join(lines[-3:])[-500:] or "no message"

    def _next(self, fd: int, size: int) -> bytes:
        """The next chunk from `fd`; b"" at its end or once close has begun."""
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        ready = dict(poller.poll())
        if self._stop_r in ready:
            return b""
        return os.read(fd, size)

    def _drain_stderr(self, stream: typing.IO[bytes]) -> None:
        while chunk := self._next(stream.fileno(), 4096):
            self._errors += chunk
            del self._errors[:-4096]

    def _read(self, out: int, pending: bytes) -> None:
        while chunk := self._next(out, CHUNK):
            *lines, pending = (pending + chunk).split(b"\n")
            with self._lock:
                for raw in lines:
                    self.demux.feed(raw)
        # The tracer went away: nothing more will come for anyone.
        with self._lock:
            if not self._closing:
                self.problem = f"the tracer exited: {self._error_text()}"
                log.error("capture: %s", self.problem)
            for capture in list(self.demux.captures.values()):
                capture.complete()

    def register(self, pid: int, recorder: BehaviourRecorder, skip_pid: int = 0) -> Capture:
        """Start attributing the events of `pid`'s pid namespace (blocking: /proc
        and the marker call)."""
        if pid_level(pid) != self.level + 1:
            raise CaptureUnavailable("the sandbox's pid namespace is not a child of the gateway's")
        ns, held = hold_pid_namespace(pid)
        capture = Capture(ns, recorder, time.monotonic_ns(), skip_pid, held=held)
        with self._lock:
            self.demux.register(capture)
        mark(REGISTER_WHICH, capture.ns)
        return capture

    async def finish(self, capture: Capture) -> Behaviour:
        """The record, once every event before now has been read (call it after
        everything in the sandbox is dead)."""
        incomplete = ""
        if self.running:
            capture.loop = asyncio.get_running_loop()
            with self._lock:
                capture.waiting = set(self._markers.cpus)
            if not self._markers.barrier(capture.ns):
                incomplete = "incomplete: no CPU could be marked"
                capture.done.set()
            try:
                async with asyncio.timeout(BARRIER_TIMEOUT_S):
                    await capture.done.wait()
            except TimeoutError:
                incomplete = "incomplete: the tracer did not confirm the end in time"
            with self._lock:
                unmarked = sorted(capture.unmarked)
            if unmarked and not incomplete:
                incomplete = f"incomplete: CPU {', '.join(map(str, unmarked))} could not be marked"
        else:
            mark(UNREGISTER_WHICH, capture.ns)
        with self._lock:
            self.demux.unregister(capture)
        let_go(capture)
        if self.problem:
            return capture_off(self.problem)
        behaviour = capture.recorder.finish()
        if incomplete:
            behaviour = dataclasses.replace(behaviour, reason=incomplete)
        return behaviour

    def _missed(self, ns: int, cpu: int) -> None:
        """From a marker thread: `cpu` could not be marked for `ns`'s barrier."""
        with self._lock:
            capture = self.demux.captures.get(ns)
            if capture is not None and cpu in capture.waiting:
                capture.waiting.discard(cpu)
                capture.unmarked.add(cpu)
                if not capture.waiting:
                    capture.complete()

    def discard(self, capture: Capture) -> None:
        mark(UNREGISTER_WHICH, capture.ns)
        with self._lock:
            self.demux.unregister(capture)
        let_go(capture)

    async def close(self) -> None:
        await asyncio.to_thread(self.close_sync)

    def close_sync(self) -> None:
        """Stop the tracer and the threads reading it (blocking, bounded: the kernel's
        release of its tracepoints goes on after this returns)."""
        with self._lock:
            self._closing = True
            proc = self._proc
        if proc is not None and proc.poll() is None:
            # Killed, not waited for. Each of its ~290 tracepoints is unregistered
            # after an RCU grace period of its own (the kernel's perf_trace_event_unreg,
            # under one mutex): ~20 s here whether bpftrace detaches them (SIGINT) or
            # its exit does. Nothing needs them gone first: its output ends with its
            # first descriptors, the rest goes on in the kernel, and the process is
            # reaped on a thread of its own (by init, if the gateway exits first).
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            threading.Thread(target=proc.wait, name="execgate-tracer-reap", daemon=True).start()
        if self._stop_w >= 0:
            os.write(self._stop_w, b"x")
        stuck = False
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=10)
                stuck = stuck or thread.is_alive()
        # A descriptor is closed only once no thread can still read it (a number
        # reused under a reader would hand it someone else's data).
        if proc is not None and not stuck:
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        if not stuck and self._stop_w >= 0:
            os.close(self._stop_r)
            os.close(self._stop_w)
            self._stop_r = self._stop_w = -1
        self._threads = []
        self._markers.close()
        self._proc = None
        self.problem = "stopped"


class TracerHub:
    """One host tracer per tracer binary for every backend of a gateway.

    The gateway makes one and hands it to each backend on the host kernel; a
    backend made without one gets a hub of its own (and closes it). A tracer
    starts with the first backend that asks and stays until the hub closes; one
    that died is replaced by the next backend that starts. Safe to use from any
    event loop (tests start backends on several).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tracers: dict[str, concurrent.futures.Future[HostTracer]] = {}

    async def acquire(self, settings: CaptureSettings) -> HostTracer:
        """The running tracer for `settings` (started now if there is none);
        raises CaptureUnavailable with the reason."""
        key = settings.tracer_path or TRACER
        with self._lock:
            pending = self._tracers.get(key)
            dead: HostTracer | None = None
            if pending is not None and pending.done():
                failed = pending.exception() is not None
                if failed or not pending.result().running:
                    dead = None if failed else pending.result()
                    pending = None
            owner = pending is None
            if pending is None:
                pending = concurrent.futures.Future()
                self._tracers[key] = pending
        if dead is not None:
            await dead.close()  # its threads and descriptors (it has exited, or stopped)
        if owner:
            tracer = HostTracer(settings)
            try:
                await tracer.start()
            except BaseException as exc:
                pending.set_exception(exc)
                raise
            pending.set_result(tracer)
            return tracer
        return await asyncio.wrap_future(pending)

    async def close(self) -> None:
        with self._lock:
            pending, self._tracers = list(self._tracers.values()), {}
        for future in pending:
            if future.done() and future.exception() is None:
                await future.result().close()


class HostCapture:
    """What a backend on the host kernel holds for capture: the tracer, the
    per-language baselines, whether capture is on and why not."""

    def __init__(
        self, settings: CaptureSettings, backend: str, tracers: TracerHub | None = None
    ) -> None:
        self.settings = settings
        self.backend = backend
        # The gateway's shared tracers, or a hub of this backend's own.
        self.hub = tracers if tracers is not None else TracerHub()
        self._own_hub = tracers is None
        self.tracer: HostTracer | None = None
        self.reason = "disabled in config" if not settings.enabled else "not started"
        self.baselines: dict[str, Baseline] = {}

    def status(self) -> tuple[bool, str]:
        if self.tracer is not None and self.tracer.running:
            return True, ""
        if self.tracer is not None and self.tracer.problem:
            return False, self.tracer.problem
        return False, self.reason

    def kinds(self) -> frozenset[str]:
        """What results record while the tracer runs: every kind (record.KINDS)."""
        return frozenset(KINDS) if self.status()[0] else frozenset()

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
        try:
            tracer = await self.hub.acquire(self.settings)
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
            # A shared tracer stays for the hub's other backends.
            if self._own_hub:
                await self.hub.close()
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

    def follow(self, pid: int, language: str, skip_pid: int = 0) -> Capture | str:
        """`begin`, blocking: for a caller already on a thread of its own."""
        on, why = self.status()
        if not on or self.tracer is None:
            return why
        try:
            return self.tracer.register(pid, self.recorder(language), skip_pid)
        except (OSError, CaptureUnavailable) as exc:
            return f"cannot follow this sandbox: {exc}"

    async def begin(self, pid: int, language: str, skip_pid: int = 0) -> Capture | str:
        """Register a claimed sandbox (its first process); the reason capture is
        off for this execution otherwise."""
        on, why = self.status()
        if not on or self.tracer is None:
            return why
        tracer = self.tracer
        registering = asyncio.ensure_future(asyncio.to_thread(self.follow, pid, language, skip_pid))
        try:
            return await asyncio.shield(registering)
        except asyncio.CancelledError:
            # The thread registers anyway: forget it once it has, or the kernel would
            # go on printing that namespace (and the next sandbox to reuse its inode).
            registering.add_done_callback(functools.partial(_forget, tracer))
            raise

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


def _forget(tracer: HostTracer, registering: asyncio.Future[Capture | str]) -> None:
    done = not registering.cancelled() and registering.exception() is None
    if done and isinstance(capture := registering.result(), Capture):
        tracer.discard(capture)


# The kernel function a task blocked opening a FIFO with no writer sleeps in.
FIFO_OPEN_WAIT = "wait_for_partner"
FIFO_OPEN_WAIT_B = FIFO_OPEN_WAIT.encode()


class IdleLook:
    """Looks at a jail's init (`pid`) for its first child once it has become its
    own program and waits for its code: an interpreter started ahead blocked
    opening the FIFO on its code file's path (backends/handover.py), or a launcher
    in read(2). What it did until then, whether the sandbox was made ahead or just
    now, is the jail's set-up, not the execution's.

    A claim under load waits for a sandbox still starting (~30-50 ms at
    concurrency 4), so a look is one pread of a /proc file held open, the rarer
    questions (has the jail exited, is the time up) are asked every eighth look,
    and the looks back off (`pause_s`): each call through the GIL costs far more
    under load than the call does alone (looking cost 2.8 ms of CPU per claim when
    every look re-read four files by path). Driven by `idle_child` (a thread) or
    `wait_idle` (the event loop: a look never blocks)."""

    def __init__(self, pid: int, timeout_s: float = IDLE_TIMEOUT_S) -> None:
        self.pid = pid
        self.timeout_s = timeout_s
        self.began = time.monotonic()
        self.deadline = self.began + timeout_s
        self._child, self._wchan, self._syscall = 0, -1, -1
        self._looks = 0
        # Held open, read with pread: a look by path costs ~45 us of CPU here, and
        # the descriptors stay with this process even if its number is given to
        # another.
        self._stat = self._children = -1
        try:
            self._stat = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
            self._children = os.open(f"/proc/{pid}/task/{pid}/children", os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, ProcessLookupError):
            self.close()
            raise OSError(
                f"the sandbox of process {pid} exited before its code was handed over"
            ) from None
        except BaseException:
            self.close()
            raise

    def look(self) -> int:
        """The child once it waits, else 0; raises OSError once the jail has exited
        or the time is up."""
        if not self._child:
            self._child, self._wchan, self._syscall = _first_child(self._children)
        child = self._child
        if child and _waits(self._wchan, self._syscall):
            # Checked once it waits: a sandbox made just now may still be its shell
            # shim, and a child not yet exec'd is the jail itself.
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{child}/exe") != os.readlink(f"/proc/{self.pid}/exe"):
                    return child
        self._looks += 1
        rare = not child or self._looks % 8 == 0
        if rare and _exited(self._stat):
            # An interpreter that never waits (one that does not read its file):
            # nothing will be handed over to it, so there is nothing to follow.
            raise OSError(
                f"the sandbox of process {self.pid} exited before its code was handed over"
            )
        if rare and time.monotonic() > self.deadline:
            raise OSError(
                f"the sandbox of process {self.pid} is not waiting after"
                f" {self.timeout_s:.0f} s" + _whereabouts(self.pid)
            )
        return 0

    def pause_s(self) -> float:
        """Until the next look: a sandbox that is nearly there is found at once, one
        that takes long is not looked at a hundred times (what the wait costs in
        latency stays under a quarter of it)."""
        return min(IDLE_LOOK_MAX_S, max(IDLE_LOOK_S, (time.monotonic() - self.began) / 4))

    def close(self) -> None:
        for fd in (self._wchan, self._syscall, self._stat, self._children):
            if fd >= 0:
                os.close(fd)
        self._wchan = self._syscall = self._stat = self._children = -1


def idle_child(
    pid: int, timeout_s: float = IDLE_TIMEOUT_S, sleep: Callable[[float], None] = time.sleep
) -> int:
    """The first child of `pid` (a jail's init) once it waits for its code
    (blocking, bounded; see IdleLook)."""
    watch = IdleLook(pid, timeout_s)
    try:
        while not (child := watch.look()):
            sleep(watch.pause_s())
        return child
    finally:
        watch.close()


async def wait_idle(
    pid: int, timeout_s: float = IDLE_TIMEOUT_S, until: Callable[[], bool] = lambda: False
) -> int:
    """`idle_child` on the event loop (each look is a pread of /proc, never a
    wait); 0 once `until()` holds (someone else looks now)."""
    watch = IdleLook(pid, timeout_s)
    try:
        while not until():
            if child := watch.look():
                return child
            await asyncio.sleep(watch.pause_s())
        return 0
    finally:
        watch.close()


def _first_child(children: int) -> tuple[int, int, int]:
    """(the first of the pids in `children` (a /proc .../children file), its wchan
    and syscall files held open), or (0, -1, -1) if there is none yet or it went
    before both were open."""
    try:
        child = int(os.pread(children, 64, 0).split()[0])
    except (OSError, ValueError, IndexError):
        return 0, -1, -1
    try:
        wchan = os.open(f"/proc/{child}/wchan", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return 0, -1, -1
    try:
        return child, wchan, os.open(f"/proc/{child}/syscall", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        os.close(wchan)
        return 0, -1, -1


def _whereabouts(pid: int) -> str:
    with contextlib.suppress(OSError, ValueError, IndexError):
        child = int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])
        return (
            f" (init {child}: {os.readlink(f'/proc/{child}/exe')},"
            f" in {Path(f'/proc/{child}/syscall').read_text().split()[0]})"
        )
    return ""


def _waits(wchan: int, syscall: int) -> bool:
    """Blocked opening a FIFO with no writer, or in read(2) (False once it has gone)."""
    try:
        where = os.pread(wchan, 64, 0)
        if where == FIFO_OPEN_WAIT_B:
            return True
        if where in (b"", b"0"):
            # Running: reading /proc/PID/syscall would wait for it to come off its CPU.
            return False
        return os.pread(syscall, 64, 0).split(maxsplit=1)[:1] == [b"0"]
    except OSError:
        return False


def _exited(stat: int) -> bool:
    """Whether the process whose /proc stat file is `stat` has exited (a zombie, or
    reaped: its file then answers ESRCH)."""
    try:
        data = os.pread(stat, 4096, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return data[data.rindex(b")") + 2 :][:1] in (b"Z", b"X")
