"""The docker-gvisor backend: the docker backend with gVisor's runsc as the runtime.

Programs run on gVisor's own kernel (the Sentry), in user space, so a kernel bug
reachable through a system call is gVisor's, not the host's: the second kernel
boundary for tenants who need one. It costs start-up time and some system call
speed. The engine must know runsc as a runtime with `--network=none` in its runtime
args, and as `runsc-egress` for sandboxes with controlled egress
(deploy/docker/start-dockerd.sh); at start-up this backend proves that its
sandboxes really run on gVisor, and refuses to start otherwise.

Behaviour capture (backends/capture/gvisor.py) uses gVisor's own strace: with it
on, sandboxes run under the capture variants of those runtimes (`runsc-capture`,
`runsc-egress-capture`), whose Sentry logs the traced calls into a directory per
container; each execution's record is read from where the log stood at hand-over
to the program's end, and the directory goes with the container.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shutil
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backends.base import BackendError, ExecResult, ExecSpec, Health, Limits
from backends.capture.gvisor import (
    TRACER,
    TraceParser,
    TraceTail,
    untraced,
)
from backends.capture.host import TracerHub
from backends.capture.record import Baseline, Behaviour, BehaviourRecorder, capture_off
from backends.capture.settings import CaptureSettings
from backends.capture.syscalls import syscall_names
from backends.docker.backend import DockerBackend
from backends.docker.reaper import LABEL_INSTANCE
from backends.docker.sandbox import Container, ContainerFactory, Outcome
from backends.docker.seccomp import bundled_profile
from backends.docker.settings import GvisorSettings
from backends.egress.addresses import NameResolver

WATCH_INTERVAL_S = 0.5
# The kinds of attempt (record.KINDS) gVisor's own trace gives.
GVISOR_KINDS = frozenset({"files", "lookups", "sockets", "ipc", "programs", "signals", "syscalls"})
WATCH_BYTES = 4 * 1024 * 1024
# A final read of the trace up to this size is made on the event loop (a short
# program's: ~4 KB for print(1), ~0.2 ms with its parse), larger ones in a thread.
INLINE_READ_BYTES = 16 * 1024
# A program that does nothing but print a line, per language: what its record holds
# is the runtime's (node opens /dev/null once it writes to a pipe), not the code's.
DO_NOTHING = {"python": "print(1)", "bash": "echo 1", "javascript": "console.log(1)"}


@dataclass
class CapturePlan:
    """Whether and where this backend's sandboxes are traced."""

    on: bool = False
    reason: str = "not started"
    directory: Path = Path("/nonexistent")
    settings: CaptureSettings = field(default_factory=CaptureSettings)
    names: dict[int, str] = field(default_factory=dict)
    baselines: dict[str, Baseline] = field(default_factory=dict)

    def recorder(self, language: str) -> BehaviourRecorder:
        c = self.settings
        return BehaviourRecorder(
            TRACER,
            self.baselines.get(language, Baseline()),
            max_files=c.max_files,
            max_programs=c.max_programs,
            max_signals=c.max_signals,
            max_bytes=c.max_bytes,
        )


class TracedFactory(ContainerFactory):
    """Containers whose Sentry traces them: each result carries its behaviour."""

    def __init__(self, plan: CapturePlan, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.plan = plan
        # Each handed-over container's trace, read from where it stood when the
        # request went in: what the launcher did before (its start) is not the code's.
        self.tails: dict[str, TraceTail] = {}

    async def execute(
        self, container: Container, spec: ExecSpec, ready: Awaitable[object] | None = None
    ) -> Outcome:
        plan = self.plan
        if not plan.on:
            return await super().execute(container, spec, ready)
        parser = TraceParser(plan.recorder(spec.language), plan.names)
        tail = TraceTail(plan.directory / container.id, parser)
        # Where the log stands, taken while the gate is waited for: the launcher,
        # blocked reading its request, logs nothing until the hand-over.
        marked = asyncio.ensure_future(asyncio.to_thread(tail.mark))
        self.tails[container.id] = tail
        watch = asyncio.ensure_future(_watch(tail, marked))
        # A task, not a bare coroutine: a gate that refuses leaves it unawaited.
        both = asyncio.ensure_future(_both(marked, ready))
        try:
            return await super().execute(container, spec, both)
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
            if not both.done():
                both.cancel()  # the mark's thread finishes alone; nothing reads the tail

    async def finish(self, container: Container, spec: ExecSpec, outcome: Outcome) -> ExecResult:
        result = await super().finish(container, spec, outcome)
        return dataclasses.replace(result, behaviour=await self.behaviour(container))

    async def behaviour(self, container: Container) -> Behaviour:
        """The record of what the program did: complete once it has ended (the
        launcher reports after everything else in the sandbox is dead, and the Sentry
        logs each call as it returns), read before the container and its log go."""
        tail = self.tails.pop(container.id, None)
        if not self.plan.on or tail is None:
            return capture_off(self.plan.reason or "not traced")
        read = tail.last_read_if_small(INLINE_READ_BYTES)
        if read is None:
            read = await asyncio.to_thread(tail.pump, True)
        if not read:
            return capture_off(f"no trace of this sandbox in {self.plan.directory}")
        return tail.parser.recorder.finish()

    async def _remove(self, cid: str, name: str, failed_start: bool = False) -> None:
        await super()._remove(cid, name, failed_start)
        self.tails.pop(cid, None)
        # The trace goes with its container.
        await asyncio.to_thread(shutil.rmtree, self.plan.directory / cid, True)


class GvisorBackend(DockerBackend):
    name = "docker-gvisor"
    Settings = GvisorSettings
    # runsc's netstack sees no socket the gateway puts in a container's namespace:
    # each sandbox is put in a namespace the gateway makes, linked to its sinkhole
    # (backends/egress/veth.py), under a runtime whose netstack takes that link.
    # Without that runtime (egress_runtime = ""): no network at all, no egress.
    network_boundary = True
    # gVisor runs its own kernel: the host's tracer would see only the Sentry.
    host_capture = False

    def __init__(
        self,
        settings: GvisorSettings | None = None,
        *,
        egress_resolver: NameResolver | None = None,
        tracers: TracerHub | None = None,
    ) -> None:
        # `tracers`: accepted like every backend on the host's side; gVisor's record
        # comes from its own kernel, so none is used.
        super().__init__(settings, egress_resolver=egress_resolver, tracers=tracers)
        self.network_boundary = bool(self.egress_runtime())
        self.capture = CapturePlan()

    # --- behaviour capture ------------------------------------------------------

    def capture_status(self) -> tuple[bool, str]:
        return self.capture.on, self.capture.reason

    def recorded_kinds(self) -> frozenset[str]:
        # The Sentry's strace of TRACED: no look-ups (stat, access: logging each
        # would cost every run far more than it tells) and no sockets.
        return GVISOR_KINDS if self.capture.on else frozenset()

    async def start(self) -> None:
        self.capture = await self.plan_capture()
        if self.settings.capture.required and not self.capture.on:
            raise BackendError(f"{self.name}: capture is required but off: {self.capture.reason}")
        await super().start()
        if self.capture.on:
            try:
                await self._learn_baselines()
            except BackendError:
                await self.close()
                raise
            # Its runs went through the pool: not the demand it is to follow.
            self.pool.forget_demand()
            self.pool.tick()

    async def health(self) -> Health:
        if self.settings.capture.required and not self.capture.on:
            return Health(ok=False, detail=f"capture is required but off: {self.capture.reason}")
        return await super().health()

    async def plan_capture(self) -> CapturePlan:
        """Whether this engine can trace the sandboxes, and if not why."""
        s, c = self.settings, self.settings.capture
        plan = CapturePlan(on=False, directory=Path(s.trace_dir), settings=c)
        if not c.enabled:
            plan.reason = "disabled in config"
            return plan
        wanted = {"capture_runtime": s.capture_runtime}
        if s.egress_runtime:
            wanted["capture_egress_runtime"] = s.capture_egress_runtime
        if unset := [key for key, name in wanted.items() if not name]:
            plan.reason = f"no capture runtime configured ({', '.join(unset)} is empty)"
            return plan
        try:
            runtimes = (await self.engine.info()).get("Runtimes") or {}
        except BackendError as exc:
            plan.reason = f"cannot ask the engine for its runtimes: {exc}"
            return plan
        for name in wanted.values():
            if why := untraced(name, runtimes.get(name)):
                plan.reason = why
                return plan
        plan.names = await asyncio.to_thread(syscall_names)
        plan.on, plan.reason = True, ""
        return plan

    async def _learn_baselines(self) -> None:
        """What each runtime does on its own: a do-nothing program, twice (a sandbox
        may be fresh or pooled), whose records later records leave out. A sandbox
        that leaves no trace turns capture off (or, required, fails the start)."""
        plan = self.capture
        languages = sorted(self._languages_served())
        learnt = await asyncio.gather(*(self._baseline(language) for language in languages))
        for language, seen in zip(languages, learnt, strict=True):
            if off := next((b for b in seen if b.capture != "on"), None):
                plan.on, plan.reason = False, off.reason
                if self.settings.capture.required:
                    raise BackendError(f"{self.name}: capture is required: {plan.reason}")
                return
            plan.baselines[language] = Baseline.learn(*seen)

    async def _baseline(self, language: str) -> list[Behaviour]:
        seen = []
        for _ in range(2):
            spec = ExecSpec(
                execution_id=f"baseline-{language}",
                language=language,
                code=DO_NOTHING.get(language, ""),
                limits=Limits(),
            )
            result = await self.run(spec)
            seen.append(result.behaviour or capture_off("no record"))
        return seen

    def _languages_served(self) -> frozenset[str]:
        return self.capabilities.languages

    def make_factory(self, settings: Any, *args: Any, **kwargs: Any) -> ContainerFactory:
        if self.capture.on:
            s = self.settings
            settings = settings.model_copy(update={"runtime": s.capture_runtime})
            if kwargs.get("egress_runtime"):
                kwargs["egress_runtime"] = s.capture_egress_runtime
        return TracedFactory(self.capture, settings, *args, **kwargs)

    async def reap_leftovers(self) -> list[str]:
        """Also the trace directories of containers the engine no longer has (a
        gateway that died before removing its own)."""
        removed = await super().reap_leftovers()
        directory = self.capture.directory
        if self.capture.on:
            # Listed before the engine is asked: a directory made after the listing
            # belongs to a container the engine already knows.
            present = await asyncio.to_thread(_entries, directory)
            known = {c.get("Id", "") for c in await self.engine.containers(LABEL_INSTANCE)}
            for stale in present - known:
                await asyncio.to_thread(shutil.rmtree, directory / stale, True)
        return removed

    def egress_runtime(self) -> str:
        return str(getattr(self.settings, "egress_runtime", ""))

    def _seccomp_json(self) -> str:
        """The bundled allowlist with clone3 allowed: runsc (with --oci-seccomp) drops
        a rule's errnoRet (google/gvisor#14688), so clone3 would fail with EPERM, glibc
        would not fall back to clone(2) and no program could start a thread. clone3's
        flags cannot be filtered; the namespaces it makes are gVisor's own. Without
        the rule that kills module loading and kexec: this runsc refuses the action
        (SCMP_ACT_KILL_PROCESS: "invalid action"), and its Sentry implements neither
        call, so each is refused (and recorded, "Unsupported syscall") anyway."""
        if self.settings.seccomp_profile != "bundled":
            return super()._seccomp_json()
        profile = bundled_profile()
        profile["syscalls"] = [
            r for r in profile["syscalls"] if r["action"] != "SCMP_ACT_KILL_PROCESS"
        ]
        for rule in profile["syscalls"]:
            if rule["names"] == ["clone3"]:
                rule["action"] = "SCMP_ACT_ALLOW"
                rule.pop("errnoRet", None)
        return json.dumps(profile, separators=(",", ":"))

    async def verify_runtime(self, probe: dict[str, Any], state: dict[str, Any]) -> None:
        """Three independent signs, all required: the engine says the probe's container
        ran with runsc; the kernel the probe saw is not the engine host's; and its
        kernel log is gVisor's or its root file system is served by gVisor's gofer."""
        runtime = state.get("Runtime")
        s = self.settings
        ours = (s.runtime, s.egress_runtime, s.capture_runtime, s.capture_egress_runtime)
        if runtime not in ours:
            raise BackendError(f"gVisor not in use: the probe ran with runtime {runtime!r}")
        host_kernel = (await self.engine.info()).get("KernelVersion")
        if probe.get("release") == host_kernel:
            raise BackendError(
                f"gVisor not in use: the probe saw the host's kernel {host_kernel!r}"
            )
        # The seccomp profile denies syslog(2), so gVisor's kernel log is rarely
        # readable; its gofer serving the root over 9p is the sign that remains.
        root_fs = probe.get("root_fs", "")
        if "gVisor" not in probe.get("kernel_log", "") and not root_fs.startswith("9p "):
            raise BackendError(f"gVisor not in use: the probe's root is {root_fs!r}")


async def _both(first: Awaitable[object], second: Awaitable[object] | None) -> None:
    await first
    if second is not None:
        await second


async def _watch(tail: TraceTail, marked: Awaitable[object]) -> None:
    """While the program runs: a log growing fast (a flood) is read and freed as it
    grows, so it never holds much more than WATCH_BYTES on the host."""
    await marked
    while True:
        await asyncio.sleep(WATCH_INTERVAL_S)
        if await asyncio.to_thread(tail.pending) >= WATCH_BYTES:
            await asyncio.to_thread(tail.pump)


def _entries(directory: Path) -> set[str]:
    try:
        return {p.name for p in directory.iterdir()}
    except OSError:
        return set()
