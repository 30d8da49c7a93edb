"""The docker backend: one fresh, hardened container per execution (runtime runc).

Each execution runs in a new container of the sandbox image (`make images`):
read-only, no network, no capabilities, no new privileges, the seccomp allowlist
all backends share (or the engine's, or one configured), an unprivileged user,
memory without swap, CPU, process and file limits, size-capped tmpfs mounts for
/workspace, /tmp, /dev/shm and /code, no host mounts and an explicit environment.
Its PID 1 is our launcher (backends/docker/launcher.py): code, input files and
stdin go in on its stdin, output and output files come back framed on its stdout,
the files collected after everything else in the container is dead, the exit report
authenticated by a nonce; the engine says how it ended when that matters (OOM).
Containers are started ahead of requests (pool.py), used once, removed.

`docker-gvisor` (backends/docker/gvisor.py) is the same with gVisor's runsc runtime.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from pathlib import Path
from typing import Any, ClassVar

from backends.attempts import Source, StartFailures, acquire
from backends.base import (
    BackendError,
    Capabilities,
    ExecResult,
    ExecSpec,
    Health,
    Limits,
    NetworkAttempt,
    SandboxBackend,
    SandboxEvent,
    Status,
)
from backends.capture.host import DO_NOTHING, Capture, HostCapture, TracerHub
from backends.capture.record import Behaviour
from backends.ceilings import clamp as clamp_limits
from backends.docker.config import LAUNCHER_SOURCE, Shape, launcher_command, reads_unbuffered
from backends.docker.engine import Engine
from backends.docker.etc import make_etc_dir, remove_etc_dir
from backends.docker.image import default_image
from backends.docker.pool import Background, Pool
from backends.docker.reaper import Instance, reap
from backends.docker.sandbox import Container, ContainerFactory
from backends.docker.seccomp import bundled_profile
from backends.docker.settings import DockerSettings
from backends.egress.addresses import NameResolver
from backends.egress.boundary import RESOLVER_HOST
from backends.egress.veth import GATEWAY_V4

log = logging.getLogger(__name__)

# Run once at start-up in a real sandbox: which runtimes the image has, and what
# kernel the sandbox sees (the gVisor backend's proof that runsc is in use).
PROBE = """
import ctypes, json, os, platform
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(4096)
n = libc.klogctl(3, buf, 4096)  # SYSLOG_ACTION_READ_ALL: refused outside gVisor
print(json.dumps({
    "present": [p for p in ARGV0S if os.access(p, os.X_OK)],
    "release": platform.release(),
    "kernel_log": buf.raw[:max(n, 0)].decode(errors="replace"),
    "root_fs": next((l.split(" - ")[1] for l in open("/proc/self/mountinfo")
                     if l.split()[4] == "/"), ""),
    "seccomp": dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines()
                    if ":\t" in l).get("Seccomp", ""),
}))
"""


class DockerBackend(SandboxBackend):
    name = "docker"
    Settings = DockerSettings
    # The gateway furnishes each container's network namespace (backends/egress/).
    network_boundary = True
    # The host kernel's tracer sees what runc's sandboxes do (backends/capture/host.py);
    # a runtime with a kernel of its own (gVisor) records its own way.
    host_capture: ClassVar[bool] = True
    shares_host_tracer = True

    def __init__(
        self,
        settings: DockerSettings | None = None,
        *,
        egress_resolver: NameResolver | None = None,
        tracers: TracerHub | None = None,
    ) -> None:
        self.settings = settings or self.Settings()
        # How the egress proxy resolves names (tests give their own; None: the host's).
        self.egress_resolver = egress_resolver
        s = self.settings
        self.instance = Instance.current()
        self.engine = Engine(s.docker_host, s.engine_threads, s.engine_timeout_s)
        self.image = s.image or default_image()
        self._factory: ContainerFactory | None = None
        self._background = Background()
        self._live: dict[str, Container] = {}
        self._languages: frozenset[str] = frozenset(s.runtimes)
        self._max = s.max_limits()
        self.start_failures = StartFailures()
        self.pool = Pool(
            s.pool_size,
            s.pool_max_age_s,
            # Before any request: python's, the usual language (or the first there is).
            self.shape_of(
                self.clamp(Limits()), min(s.runtimes, key=lambda k: k != "python", default="")
            ),
            self._make,
            self._dispose,
            self._background,
            lambda exc: self.start_failures.record(exc, background=True),
            max_size=s.pool_max_size,
            fill_concurrency=s.pool_fill_concurrency,
            demand_window_s=s.pool_demand_window_s,
            remove_concurrency=s.remove_concurrency,
            release=self._release,
        )
        self._reaper: asyncio.Task[None] | None = None
        self._maintainer: asyncio.Task[None] | None = None
        self._etc_dir: Path | None = None  # the generated /etc files (etc.py)
        self.host_trace = HostCapture(s.capture, self.name, tracers)

    # --- SandboxBackend ------------------------------------------------------------

    @property
    def capabilities(self) -> Capabilities:
        s = self.settings
        return Capabilities(
            languages=self._languages,
            max_limits=self._max,
            egress=self.network_boundary,
            # Reported by the launcher (PID 1, after reaping every process) in its
            # nonce-authenticated exit report; zero when there is none: best effort.
            usage_accounting=True,
            extra={
                "runtime": s.runtime,
                "image": self.image,
                "seccomp": s.seccomp_profile
                if s.seccomp_profile in ("bundled", "engine")
                else "custom",
                "user": s.user,
                "pool_size": s.pool_size,
            },
        )

    async def start(self) -> None:
        self.pool.open()
        s = self.settings
        await self.engine.ping()
        image_id = await self.engine.image_id(self.image)
        launcher = await asyncio.to_thread(lambda: launcher_command(LAUNCHER_SOURCE.read_text()))
        seccomp = await asyncio.to_thread(self._seccomp_json)
        if self._etc_dir is None:
            # gVisor's sandboxes ask the sinkhole's resolver across the veth; runc's,
            # the gateway's resolver in their own namespace.
            nameserver = GATEWAY_V4 if self.egress_runtime() else RESOLVER_HOST
            try:
                self._etc_dir = await asyncio.to_thread(make_etc_dir, nameserver)
            except OSError as exc:
                raise BackendError(f"cannot write the sandboxes' /etc files: {exc}") from exc
        self._factory = self.make_factory(
            s, self.engine, self.instance, self.name, image_id, launcher, seccomp,
            boundary=self.network_boundary, egress_runtime=self.egress_runtime(),
            resolver=self.egress_resolver, etc_dir=str(self._etc_dir),
        )  # fmt: skip
        await self.reap_leftovers()
        try:
            if self.host_capture:
                await self.host_trace.start()
            await self._probe()
            await self._learn_host_baselines()
        except BackendError:
            await self.close()
            raise
        self._reaper = asyncio.ensure_future(self._reap_periodically())
        self._maintainer = asyncio.ensure_future(self.pool.maintain())
        self.pool.replenish()

    async def health(self) -> Health:
        try:
            await self.engine.ping()
        except BackendError as exc:
            return Health(ok=False, detail=str(exc))
        if self._factory is None:
            return Health(ok=False, detail="backend not started")
        if self.pool.fill_error and not self.pool.ready:
            return Health(ok=False, detail=f"containers cannot be started: {self.pool.fill_error}")
        if self.host_capture and (problem := self.host_trace.health_problem()):
            return Health(ok=False, detail=problem)
        return Health(
            ok=True,
            detail=f"engine reachable, {len(self._live)} running, {len(self.pool.ready)} ready",
        )

    async def close(self) -> None:
        for task in (self._reaper, self._maintainer):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._reaper = self._maintainer = None
        await self.pool.drain()
        for container in list(self._live.values()):
            container.stop.set()
        for _ in range(1000):
            if not self._live and not self.pool.filling and not self._background.tasks:
                break
            await asyncio.sleep(0.01)
        await self.pool.drain()  # made while we waited
        if self._factory is not None:
            with contextlib.suppress(BackendError):
                await reap(self.engine, self.instance, lambda name: False)
        await self.engine.close()
        # A closed backend can be started again: a new engine client.
        s = self.settings
        self.engine = Engine(s.docker_host, s.engine_threads, s.engine_timeout_s)
        self._factory = None
        if self._etc_dir is not None:
            await asyncio.to_thread(remove_etc_dir, self._etc_dir)
            self._etc_dir = None
        await self.host_trace.close()

    def capture_status(self) -> tuple[bool, str]:
        if not self.host_capture:
            return super().capture_status()
        return self.host_trace.status()

    def recorded_kinds(self) -> frozenset[str]:
        return self.host_trace.kinds() if self.host_capture else frozenset()

    async def run(self, spec: ExecSpec) -> ExecResult:
        factory = self._require_factory()
        if spec.language not in self._languages:
            raise BackendError(f"{self.name} backend does not serve language {spec.language!r}")
        spec = dataclasses.replace(spec, limits=self.clamp(spec.limits))
        shape = self.shape_of(spec.limits, spec.language)
        self.pool.want(shape)
        s = self.settings
        # The pool's container, or one already starting for it (never a start of our
        # own queued behind the pool's).
        loop = asyncio.get_running_loop()
        began = loop.time()
        claimed = [await self.pool.claim(shape, s.start_deadline_s)]  # None: a miss
        left = s.start_deadline_s - (loop.time() - began)  # one deadline for both
        source = Source(
            take=lambda: claimed.pop() if claimed else self.pool.take(shape),
            dead=factory.dead,
            make=lambda: self.pool.track(factory.make(shape, spec.execution_id)),
            discard=self.pool.disposer.put,
        )
        try:
            container, failed = await acquire(source, s.start_attempts, left, self.start_failures)
        except BackendError:
            self.pool.replenish()  # in place of the dead and the failed
            raise
        self.pool.replenish()  # its replacement: started once it can (the pool's give-way)
        with self.pool.executing():
            return await self._run_in(container, spec, failed)

    async def _run_in(
        self, container: Container, spec: ExecSpec, failed: tuple[SandboxEvent, ...]
    ) -> ExecResult:
        """Run `spec` in a container acquired for it; it is removed afterwards."""
        factory = self._require_factory()
        self._live[container.name] = container
        ended = False  # the program is known to be over (its removal can wait its turn)
        capture: Capture | str | None = None
        try:
            if self.host_capture:
                # Claimed now: what the launcher did while it waited is not this run's.
                capture = await self.host_trace.begin(container.pid, spec.language, skip_pid=1)
            # Handed over once the gate has passed (inside execute, overlapping the
            # request's framing): whatever happens from there is this run's result.
            outcome = await factory.execute(container, spec)
            ended = True
            network: tuple[NetworkAttempt, ...] = ()
            network_events: tuple[SandboxEvent, ...] = ()
            if container.egress is not None:
                network, network_events = await container.egress.finish()
            result = await factory.finish(container, spec, outcome)
            if capture is not None:
                # The launcher reported after everything else in the container died.
                behaviour = await self.host_trace.end(capture)
                result = dataclasses.replace(result, behaviour=behaviour)
                capture = None
            return dataclasses.replace(
                result, network=network, events=failed + result.events + network_events
            )
        finally:
            self.host_trace.drop(capture)
            # Removal goes on in the background, tracked, and survives this request's
            # cancellation; queued (bounded) once nothing of the program runs in it,
            # at once if something may (its forced removal kills it); the reaper is
            # the backstop.
            self.pool.disposer.put(container, urgent=not ended)
            self._live.pop(container.name, None)

    # --- pool, reaper, probe ---------------------------------------------------------

    @property
    def running_sandboxes(self) -> frozenset[str]:
        """Names of the sandboxes running an execution right now."""
        return frozenset(self._live)

    @property
    def ready_sandboxes(self) -> frozenset[str]:
        return self.pool.ready

    async def wait_settled(self, timeout_s: float = 30.0) -> None:
        """Wait until no container is being made or removed in the background."""
        await self._background.settle(timeout_s)

    async def own_containers(self) -> set[str]:
        """Names of the containers the engine has for this instance (any state)."""
        found = await self.engine.containers(f"execgate.instance={self.instance.id}")
        return {(c.get("Names") or ["?"])[0].lstrip("/") for c in found}

    def _require_factory(self) -> ContainerFactory:
        if self._factory is None:
            raise BackendError(f"{self.name} backend used before start()")
        return self._factory

    def _owned(self, name: str) -> bool:
        return self._factory is not None and name in self._factory.tracked

    async def _make(self, shape: Shape) -> Container:
        return await self._require_factory().make(shape)

    async def _dispose(self, container: Container) -> None:
        await self._require_factory().dispose(container)

    async def _release(self, container: Container) -> None:
        await self._require_factory().release(container)

    async def reap_leftovers(self) -> list[str]:
        """Remove containers of dead gateways and this one's own untracked leftovers."""
        return await reap(self.engine, self.instance, self._owned)

    async def _reap_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.settings.reap_interval_s)
            try:
                await self.reap_leftovers()
            except BackendError as exc:
                log.warning("docker: reaper: %s", exc)

    async def _probe(self) -> None:
        factory = self._require_factory()
        argv0s = sorted({r.argv[0] for r in self.settings.runtimes.values()})
        spec = ExecSpec(
            execution_id="probe",
            language="python",
            code=PROBE.replace("ARGV0S", repr(argv0s)),
            limits=self.clamp(Limits(timeout_s=30, memory_mb=128, pids=16, disk_mb=1)),
        )
        if "python" not in self.settings.runtimes:
            raise BackendError("the probe needs the python runtime")
        shape = self.shape_of(spec.limits, spec.language)
        # A start that fails before the probe is handed over is retried as any
        # request's would be (no request carries the failures: reported on their own).
        container, failed = await acquire(
            Source(
                take=lambda: None,
                dead=factory.dead,
                make=lambda: factory.make(shape, "probe"),
                discard=lambda container: None,
            ),
            self.settings.start_attempts,
            self.settings.start_deadline_s,
            self.start_failures,
        )
        self.start_failures.report(failed)
        try:
            result = await factory.finish(container, spec, await factory.execute(container, spec))
            state = await self.engine.state(container.id)
        finally:
            await factory.dispose(container)
        if result.status != Status.OK:
            detail = result.stderr.decode(errors="replace")[-500:]
            raise BackendError(f"{self.name} probe ended {result.status}: {detail}")
        found: dict[str, Any] = json.loads(result.stdout)
        present = set(found["present"])
        self._languages = frozenset(
            lang for lang, rt in self.settings.runtimes.items() if rt.argv[0] in present
        )
        await self.verify_runtime(found, state)
        # A runtime may ignore the profile it was given (runsc without --oci-seccomp).
        if found.get("seccomp") != "2":
            raise BackendError(
                f"{self.name}: the sandbox runs without a seccomp filter"
                f" (Seccomp: {found.get('seccomp')!r}); for runsc add --oci-seccomp"
            )

    async def _learn_host_baselines(self) -> None:
        """With host capture on: a do-nothing program per language through the real
        path, in containers of their own (the pool neither serves nor follows them);
        what it did is the runtime's own start-up, left out of records. They are gone
        before start() returns."""
        if not self.host_capture or not self.host_trace.status()[0]:
            return
        factory = self._require_factory()
        s = self.settings
        for language in sorted(self._languages):
            spec = ExecSpec(
                execution_id=f"baseline-{language}",
                language=language,
                code=DO_NOTHING.get(language, ""),
                limits=self.clamp(Limits(timeout_s=30, memory_mb=128, pids=16, disk_mb=1)),
            )

            async def once(spec: ExecSpec = spec) -> Behaviour | None:
                shape = self.shape_of(spec.limits, spec.language)
                source = Source(
                    take=lambda: None,
                    dead=factory.dead,
                    make=lambda: factory.make(shape, spec.execution_id),
                    discard=self.pool.disposer.put,
                )
                container, failed = await acquire(
                    source, s.start_attempts, s.start_deadline_s, self.start_failures
                )
                result = await self._run_in(container, spec, failed)
                if result.status != Status.OK:
                    detail = result.stderr.decode(errors="replace")[-300:]
                    raise BackendError(
                        f"{self.name}: do-nothing {spec.language} ended {result.status}: {detail}"
                    )
                return result.behaviour

            await self.host_trace.learn(language, None, once)
        await self.wait_settled()

    def make_factory(self, *args: Any, **kwargs: Any) -> ContainerFactory:
        """The maker of this backend's containers (docker-gvisor's reads their trace)."""
        return ContainerFactory(*args, **kwargs)

    def egress_runtime(self) -> str:
        """The runtime that puts a sandbox in a namespace the gateway made and linked
        to its sinkhole ("": none, the gateway furnishes the container's own)."""
        return ""

    async def verify_runtime(self, probe: dict[str, Any], state: dict[str, Any]) -> None:
        """Check that the sandbox ran where it should (the gVisor backend insists)."""
        if state.get("Runtime") not in (self.settings.runtime, None):
            raise BackendError(f"the engine ran the probe with runtime {state.get('Runtime')!r}")

    # --- helpers -----------------------------------------------------------------

    def _seccomp_json(self) -> str:
        """The profile the engine is given ("" for its own default); blocking."""
        choice = self.settings.seccomp_profile
        if choice == "engine":
            return ""
        try:
            if choice == "bundled":
                return json.dumps(bundled_profile(), separators=(",", ":"))
            return json.dumps(json.loads(Path(choice).read_text()), separators=(",", ":"))
        except (OSError, ValueError) as exc:
            raise BackendError(f"seccomp profile {choice}: {exc}") from exc

    def shape_of(self, limits: Limits, language: str) -> Shape:
        """The container a request of these limits and language needs (its language
        only when interpreters start ahead)."""
        s = self.settings
        ahead = s.start_interpreter_ahead and language in s.runtimes
        if ahead and reads_unbuffered(s, language):
            ahead = s.ahead_unbuffered_max_bytes > 0
        return Shape.of(limits, language if ahead else "")

    def clamp(self, limits: Limits) -> Limits:
        return clamp_limits(limits, self._max)
