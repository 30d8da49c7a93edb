"""The nsjail backend: one fresh, namespaced, cgroup-limited jail per execution.

Each sandbox (sandbox.py) has its own tmpfs (the disk cap) holding the
code, workspace, /tmp and /dev/shm; its own cgroup (memory, pids, CPU), which a
/bin/sh shim joins before exec'ing nsjail, so nsjail and everything it starts
are inside from the first instruction; and nsjail's new user, pid, mount,
ipc, uts and cgroup namespaces, a network namespace whose only ways out are
the gateway's (backends/egress/), the sandbox user mapped to an
unprivileged host uid, a seccomp allowlist and read-only runtime directories.

Making a sandbox (nsjail's own start-up, namespaces, mounts) and starting an
interpreter cost more than a small program's whole run, so this backend keeps
a few made ahead of requests (`warm_pool_size`), jailed, each with its
language's interpreter started and waiting for its code (backends/handover.py);
the pool's share per language follows the languages requested in the last
minute (backends/demand.py). Each is used for exactly one execution and destroyed
after it. The gateway process must be root (mounts, uid mapping, cgroups).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import logging
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Coroutine
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
    SandboxBackend,
    pass_gate,
)
from backends.capture.host import (
    DO_NOTHING,
    IDLE_LOOK_MAX_S,
    Capture,
    HostCapture,
    TracerHub,
    idle_child,
    wait_idle,
)
from backends.capture.record import Behaviour
from backends.ceilings import clamp as clamp_limits
from backends.cgroups import CgroupError, CgroupManager, detect
from backends.demand import Demand
from backends.egress.addresses import NameResolver
from backends.giveway import GiveWay
from backends.nsjail.host import (
    COMPILED_POLICY_NAME,
    available_languages,
    check_binary,
    check_root,
    compile_policy,
    compiler_beside,
    default_nsjail_binary,
    owner_alive,
    prepare_state_dir,
    shim_beside,
)
from backends.nsjail.sandbox import Sandbox, SandboxFactory
from backends.nsjail.seccomp_audit import SeccompWatcher, syscall_names
from backends.nsjail.settings import NsjailSettings
from backends.workspace import WorkspaceError, WorkspaceManager

log = logging.getLogger(__name__)

# Do-nothing programs: each proves its runtime and, with capture on, is its baseline.
SMOKE_CODE = DO_NOTHING


class NsjailBackend(SandboxBackend):
    name = "nsjail"
    Settings = NsjailSettings
    shares_host_tracer = True
    # What makes, runs and releases one sandbox (a test may put a subclass here).
    Factory: ClassVar[type[SandboxFactory]] = SandboxFactory

    def __init__(
        self,
        settings: NsjailSettings | None = None,
        *,
        egress_resolver: NameResolver | None = None,
        tracers: TracerHub | None = None,
    ) -> None:
        self.settings = settings or NsjailSettings()
        # How the egress proxy resolves names (tests give their own; None: the host's).
        self.egress_resolver = egress_resolver
        s = self.settings
        self.binary = Path(s.nsjail_path) if s.nsjail_path else default_nsjail_binary()
        self.state_dir = Path(s.state_dir).absolute()
        self.etc_dir = self.state_dir / "etc"
        self.policy_path = (
            Path(s.seccomp_policy) if s.seccomp_policy else self.state_dir / "seccomp.kafel"
        )
        # What each nsjail is given: the policy, or, for `make nsjail`'s build, the
        # policy compiled once at start (host.compiler_beside).
        self.jail_policy_path = self.policy_path
        self.workspaces = WorkspaceManager(
            self.state_dir / "runs", s.sandbox_uid, s.sandbox_gid, s.inodes_per_mb
        )
        self.cgroups: CgroupManager | None = None
        self._factory: SandboxFactory | None = None
        self._prefix = f"{os.getpid()}-{secrets.token_hex(4)}"
        self._counter = itertools.count(1)
        self._live: dict[str, Sandbox] = {}
        # Sandboxes made ahead of requests, per language, oldest first; each is
        # used once. How many of each: recent demand.
        self._pools: dict[str, collections.deque[Sandbox]] = collections.defaultdict(
            collections.deque
        )
        self._filling: collections.Counter[str] = collections.Counter()
        self._demand = Demand()
        # The limits of each language's latest request: what a sandbox made ahead is
        # primed with, since the next request most likely has the same.
        self._shapes: dict[str, Limits] = {}
        self._fill_error = ""
        self._background: set[asyncio.Future[None]] = set()
        # Refills, and the teardown of sandboxes whose program has ended, wait for a
        # quiet moment: the request that just ran still has its records and answer.
        self.give_way = GiveWay()
        self._closing = False
        self._languages: frozenset[str] = frozenset(s.runtimes)
        self._max = s.max_limits()
        self.start_failures = StartFailures()
        # Names refused syscalls (settings.seccomp_log) from the kernel log.
        self._seccomp: SeccompWatcher | None = None
        # What the code tried beyond the network, from the host kernel (bpftrace).
        self.capture = HostCapture(s.capture, self.name, tracers)

    @property
    def instance_prefix(self) -> str:
        """Names of this instance's per-sandbox cgroups and directories start so."""
        return self._prefix

    # --- SandboxBackend ------------------------------------------------------------

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            languages=self._languages,
            max_limits=self._max,
            egress=True,
            usage_accounting=True,
            extra={
                "cgroup": self.cgroups.version if self.cgroups else None,
                "seccomp": "allowlist",
                "sandbox_uid": self.settings.sandbox_uid,
                "warm_pool_size": self.settings.warm_pool_size,
                "interpreters_started_ahead": self.settings.start_interpreter_ahead,
            },
        )

    async def start(self) -> None:
        self._closing = False
        await asyncio.to_thread(self._start_sync)
        if self.settings.seccomp_log and self._seccomp is None:
            self._seccomp = SeccompWatcher(await asyncio.to_thread(syscall_names))
            try:
                self._seccomp.start()
            except OSError as exc:
                self._seccomp = None
                raise BackendError(f"seccomp_log: cannot read /dev/kmsg: {exc}") from exc
        try:
            await self.capture.start()
        except BackendError:
            await self.close()
            raise
        # One real sandbox per language: proves nsjail, the seccomp policy, the
        # mounts and each runtime together, before any request depends on them.
        for language in sorted(self._languages):
            smoke = ExecSpec(
                execution_id=f"smoke-test-{language}",
                language=language,
                code=SMOKE_CODE.get(language, ""),
                limits=Limits(timeout_s=30, memory_mb=256, pids=32, disk_mb=1),
            )
            try:
                result = await self._run(smoke, demand=False)
            except BackendError as exc:
                await self.close()
                raise BackendError(f"nsjail smoke test ({language}) failed: {exc}") from exc
            if result.status != "ok":
                await self.close()
                detail = result.stderr.decode(errors="replace")[-500:]
                raise BackendError(
                    f"nsjail smoke test ({language}) ended {result.status}: {detail}"
                )
            # A do-nothing program: what it did is the runtime's own start-up.
            await self.capture.learn(language, result.behaviour, self._behaviour_of(smoke))

    async def health(self) -> Health:
        problems = []
        if not os.access(self.binary, os.X_OK):
            problems.append(f"nsjail binary {self.binary} is not executable")
        if self.cgroups is None:
            problems.append("backend not started")
        elif problem := self.cgroups.problem():
            problems.append(problem)
        if not self.jail_policy_path.is_file():
            problems.append(f"seccomp policy {self.jail_policy_path} is missing")
        if not self.workspaces.runs_dir.is_dir():
            problems.append(f"state directory {self.workspaces.runs_dir} is missing")
        if self._fill_error and not self.waiting():
            problems.append(f"sandboxes cannot be made ahead: {self._fill_error}")
        if problem := self.capture.health_problem():
            problems.append(problem)
        if problems:
            return Health(ok=False, detail="; ".join(problems))
        ready = ", ".join(f"{len(p)} {lang}" for lang, p in sorted(self._pools.items()) if p)
        return Health(ok=True, detail=f"{len(self._live)} running, ready: {ready or 'none'}")

    async def close(self) -> None:
        self._closing = True
        await self._dispose_pooled()
        # Stop what still runs; each run() then winds down and releases its sandbox.
        for sandbox in list(self._live.values()):
            sandbox.stop.set()
        for _ in range(500):
            if not self._live and not self._filling.total() and not self._background:
                break
            await asyncio.sleep(0.01)
        await self._dispose_pooled()  # made while we waited
        await asyncio.to_thread(self._reap, lambda name: not name.startswith(self._prefix))
        if self._seccomp is not None:
            self._seccomp.close()
            self._seccomp = None
        await self.capture.close()

    def capture_status(self) -> tuple[bool, str]:
        return self.capture.status()

    def recorded_kinds(self) -> frozenset[str]:
        return self.capture.kinds()

    async def run(self, spec: ExecSpec) -> ExecResult:
        return await self._run(spec, demand=True)

    async def _run(self, spec: ExecSpec, demand: bool) -> ExecResult:
        with self.give_way.executing():
            return await self._execute(spec, demand)

    async def _execute(self, spec: ExecSpec, demand: bool) -> ExecResult:
        factory = self._require_factory()
        if spec.language not in self._languages:
            raise BackendError(f"nsjail backend does not serve language {spec.language!r}")
        spec = dataclasses.replace(spec, limits=self.clamp(spec.limits))
        language = spec.language
        if demand:  # the start-up smoke tests are not demand
            self._demand.record(language)
            self._shapes[language] = spec.limits
        source = Source(
            take=lambda: self._take_pooled(language),
            dead=factory.dead,
            make=lambda: factory.make(self._next_name(), language),
            discard=lambda sandbox: self._in_background(self._discard_waiting(sandbox)),
        )
        s = self.settings
        try:
            sandbox, failed = await acquire(
                source, s.start_attempts, s.start_deadline_s, self.start_failures
            )
        except BackendError:
            self._replenish()  # in place of the dead and the failed
            raise
        self._live[sandbox.name] = sandbox
        seccomp = self._seccomp
        if seccomp is not None:
            seccomp.watch(sandbox.name)
        ended = False  # the capture has made its record
        over = False  # nothing of the program runs any more
        # The request applied and the sandbox followed in one trip to a thread; the
        # gate (the gateway's record of the start) passes meanwhile.
        claim = asyncio.ensure_future(asyncio.to_thread(self._claim, factory, sandbox, spec))
        try:
            capture = await asyncio.shield(claim)
            await pass_gate(spec)
            outcome = await factory.execute(sandbox, spec)
            if factory.has_leftovers(sandbox):  # a program that left something running
                await asyncio.to_thread(factory.kill_leftovers, sandbox)
            over = True
            # Nothing runs in the sandbox now: what it did is complete, and the three
            # accounts of it are read at once.
            # The capture's end first: its barrier wakes a thread on every CPU, and
            # those wake-ups then overlap the rest instead of following it.
            behaviour, egress, finished = await asyncio.gather(
                self.capture.end(capture),
                sandbox.egress.finish(),
                asyncio.to_thread(factory.finish, sandbox, spec, outcome),
                return_exceptions=True,
            )
            ended = not isinstance(behaviour, BaseException)
            if isinstance(egress, BaseException):
                raise egress
            if isinstance(finished, BaseException):
                raise finished
            if isinstance(behaviour, BaseException):
                raise behaviour
            network, network_events = egress
            refused = seccomp.events(sandbox.name) if seccomp is not None else ()
            events = failed + finished.events + refused + network_events
            return dataclasses.replace(
                finished, network=network, events=events, behaviour=behaviour
            )
        finally:
            if not ended and claim.done():
                self._drop_followed(claim)
            elif not ended:  # cancelled while claiming: forget it once it is followed
                claim.add_done_callback(self._drop_followed)
            if seccomp is not None:
                seccomp.events(sandbox.name)  # stops watching, whatever happened
            if not sandbox.released:
                # Tracked: if this request is cancelled, disposal goes on regardless.
                # Awaited while something of the program may still run; once nothing
                # can, what is left (mounts, the cgroup) goes after the answer.
                disposal = self._in_background(
                    self._dispose_after(claim, factory, sandbox, when_quiet=over)
                )
                if not over:
                    await asyncio.shield(disposal)
            self._in_background(self._close_egress(sandbox))  # off the request's path
            self._live.pop(sandbox.name, None)
            # Only now: making a sandbox while this one starts would slow it down.
            self._replenish()

    def _behaviour_of(self, spec: ExecSpec) -> Callable[[], Awaitable[Behaviour | None]]:
        async def once() -> Behaviour | None:
            return (await self._run(spec, demand=False)).behaviour

        return once

    def _drop_followed(self, claim: asyncio.Future[Capture | str]) -> None:
        if not claim.cancelled() and claim.exception() is None:
            self.capture.drop(claim.result())

    async def _dispose_after(
        self,
        claim: asyncio.Future[Capture | str],
        factory: SandboxFactory,
        sandbox: Sandbox,
        *,
        when_quiet: bool,
    ) -> None:
        """Dispose of `sandbox` once its claim's thread is done with it; `when_quiet`
        (nothing of its program runs any more): after giving way to executions."""
        await asyncio.wait([claim])
        self.capture.drop(self._take_primed(sandbox))  # the claim took it, unless it failed first
        if when_quiet:
            await self.give_way.wait(lambda: not self._closing)
        await factory.dispose(sandbox)

    async def _close_egress(self, sandbox: Sandbox) -> None:
        """Close the sandbox's network boundary (its program has ended or been
        killed) once executions have given it a quiet moment."""
        await self.give_way.wait(lambda: not self._closing)
        await sandbox.egress.closed()

    def _claim(self, factory: SandboxFactory, sandbox: Sandbox, spec: ExecSpec) -> Capture | str:
        """Apply the request to the sandbox, then attribute what it does from now on
        to this execution (blocking)."""
        try:
            factory.configure(sandbox, spec)  # marks it claimed: priming stops here
        except BaseException:
            self.capture.drop(self._take_primed(sandbox))
            raise
        primed = self._take_primed(sandbox)
        on, why = self.capture.status()
        if not on:
            self.capture.drop(primed)
            return why
        if primed is not None:
            # Followed since priming, while its interpreter waited: what counts starts
            # now, as it would from a registration made now.
            primed.since_ns = time.monotonic_ns()
            return primed
        assert sandbox.proc is not None
        try:
            init = sandbox.child or idle_child(sandbox.proc.pid)
        except OSError as exc:
            return f"cannot follow this sandbox: {exc}"
        return self.capture.follow(init, spec.language)

    def _take_primed(self, sandbox: Sandbox) -> Capture | None:
        """The capture priming registered for `sandbox`, now the caller's to use or
        drop (once: None after that)."""
        with sandbox.lock:
            sandbox.claimed = True  # no longer the pool's: priming leaves it alone
            primed, sandbox.capture = sandbox.capture, None
        return primed

    async def _discard_waiting(self, sandbox: Sandbox) -> None:
        """Dispose of a sandbox no request has used, and of what priming registered."""
        self.capture.drop(self._take_primed(sandbox))
        await self._require_factory().dispose(sandbox)

    # --- the pool of sandboxes made ahead ---------------------------------------------

    @property
    def running_sandboxes(self) -> frozenset[str]:
        """Names of the sandboxes running an execution right now."""
        return frozenset(self._live)

    @property
    def ready_sandboxes(self) -> frozenset[str]:
        """Names of the sandboxes made ahead and waiting for a request."""
        return frozenset(sandbox.name for sandbox in self.waiting())

    def waiting(self) -> tuple[Sandbox, ...]:
        """The sandboxes made ahead and waiting for a request, oldest first per language."""
        return tuple(sandbox for pool in self._pools.values() for sandbox in pool)

    def ready_languages(self) -> dict[str, int]:
        """How many sandboxes wait for a request, per language."""
        return {language: len(pool) for language, pool in self._pools.items() if pool}

    async def wait_settled(self, timeout_s: float = 10.0) -> None:
        """Wait until no sandbox is being made or disposed of in the background and
        every sandbox made ahead waits for its code: its nsjail is started once
        `make` returns, but its interpreter starts after that (~10 ms of CPU), and a
        request measured against a pool still starting shares the CPUs with it."""
        deadline = time.monotonic() + timeout_s
        async with asyncio.timeout(timeout_s):
            while True:
                while self._background:
                    await asyncio.gather(*self._background, return_exceptions=True)
                # Primed ones were found waiting already (nothing wakes them but a claim).
                waiting = [s for s in self.waiting() if s.proc is not None and not s.child]
                pids = [s.proc.pid for s in waiting if s.proc is not None]
                left = max(0.0, deadline - time.monotonic())
                # A sandbox that died waiting is the next claim's to find and record.
                await asyncio.gather(
                    *(asyncio.to_thread(idle_child, pid, left) for pid in pids),
                    return_exceptions=True,
                )
                if not self._background:
                    return

    def _require_factory(self) -> SandboxFactory:
        if self._factory is None:
            raise BackendError("nsjail backend used before start()")
        return self._factory

    def _next_name(self) -> str:
        return f"{self._prefix}-{next(self._counter)}"

    async def _dispose_pooled(self) -> None:
        for pool in self._pools.values():
            while pool:
                await self._discard_waiting(pool.popleft())

    def _take_pooled(self, language: str) -> Sandbox | None:
        """The oldest waiting sandbox of `language` young enough, or None; whether
        it is still alive is the caller's check (backends/attempts.py), so that one
        that died while it waited is recorded, not just dropped."""
        max_age = self.settings.warm_max_age_s
        pool = self._pools[language]
        while pool:
            sandbox = pool.popleft()
            if time.monotonic() - sandbox.created < max_age:
                return sandbox
            self._in_background(self._discard_waiting(sandbox))
        return None

    def _replenish(self) -> None:
        """Make sandboxes up to each language's share of the pool; dispose of the
        waiting ones of a language past its share (the oldest first)."""
        if self._closing:
            return
        targets = self._demand.shares(self.settings.warm_pool_size, self._default_language())
        for language, pool in self._pools.items():
            while len(pool) + self._filling[language] > targets.get(language, 0) and pool:
                self._in_background(self._discard_waiting(pool.popleft()))
        for language, target in targets.items():
            while len(self._pools[language]) + self._filling[language] < target:
                self._filling[language] += 1
                self._in_background(self._fill_one(language))

    def _default_language(self) -> str:
        """The pool's language before any request: python when served."""
        return "python" if "python" in self._languages else min(self._languages)

    async def _fill_one(self, language: str) -> None:
        factory = self._require_factory()
        try:
            # The next request of this language is served either way: give way to
            # the one just finishing. With none waiting, the refill starts at once.
            await self.give_way.wait(lambda: not self._closing and bool(self._pools[language]))
            if self._closing:
                return
            sandbox = await factory.make(self._next_name(), language)
        except Exception as exc:  # a background task: nothing else would see it
            self._fill_error = str(exc)
            log.warning("nsjail: cannot make a sandbox ahead: %s", exc)
            self.start_failures.record(exc, background=True)
            return
        finally:
            self._filling[language] -= 1
        self._fill_error = ""
        if self._closing:
            await factory.dispose(sandbox)
            return
        self._pools[language].append(sandbox)
        await self._prime(factory, sandbox)

    async def _prime(self, factory: SandboxFactory, sandbox: Sandbox) -> None:
        """Off the request path, once the sandbox's interpreter waits for its code:
        what a claim would otherwise do on its path (SandboxFactory.prime). Only
        while no execution runs: under load the looks and the trip to a thread
        would cost the executions more CPU than their claims save, and a claim
        does it all itself as before. Looks from the loop (a look never blocks)."""
        assert sandbox.proc is not None
        pid = sandbox.proc.pid

        def gone() -> bool:
            return sandbox.claimed or sandbox.released or self._closing

        def stop() -> bool:
            return gone() or self.give_way.running > 0

        while not gone():
            if self.give_way.running > 0:
                # One made while an execution ran: primed once they have stopped.
                if not await self.give_way.wait(lambda: not gone()):
                    await asyncio.sleep(IDLE_LOOK_MAX_S)  # giving way is off: no spin
                continue
            try:
                child = await wait_idle(pid, until=stop)
            except OSError:
                return  # dead or stuck: the claim that takes it finds and records why
            if child and not stop():
                shape = self._shapes.get(sandbox.language)
                await asyncio.to_thread(self._prime_sync, factory, sandbox, child, shape)
                return

    def _prime_sync(
        self, factory: SandboxFactory, sandbox: Sandbox, child: int, shape: Limits | None
    ) -> None:
        factory.prime(sandbox, child, shape)
        # Followed from now (the claim moves the record's start to itself), once the
        # runtime's own baseline is known: a recorder made before it would count the
        # runtime's doings as the code's.
        if not sandbox.child or sandbox.language not in self.capture.baselines:
            return
        with sandbox.lock:
            if sandbox.claimed or sandbox.released or sandbox.capture is not None:
                return
            followed = self.capture.follow(child, sandbox.language)
            if isinstance(followed, Capture):
                sandbox.capture = followed

    def _in_background(self, coro: Coroutine[Any, Any, None]) -> asyncio.Future[None]:
        task = asyncio.ensure_future(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    # --- helpers -----------------------------------------------------------------

    def clamp(self, limits: Limits) -> Limits:
        return clamp_limits(limits, self._max)

    def _start_sync(self) -> None:
        s = self.settings
        check_binary(self.binary)
        shim = shim_beside(self.binary)
        # Which build runs the sandboxes, and what starts it.
        log.info("nsjail: %s, started by %s", self.binary, shim or "a /bin/sh script")
        check_root(s)
        self._languages = available_languages(s)
        try:
            prepare_state_dir(self.state_dir, self.policy_path, not s.seccomp_policy, s.hostname)
            if compiler := compiler_beside(self.binary):
                # Read once: a configured policy edited later applies at the next start.
                compiled = self.state_dir / COMPILED_POLICY_NAME
                compile_policy(compiler, self.policy_path, compiled)
                self.jail_policy_path = compiled
            log.info("nsjail seccomp policy: %s", self.jail_policy_path)
            self.workspaces.prepare()
            self.cgroups = detect(Path(s.cgroup_root), s.cgroup_parent, s.cgroup_version)
            self.cgroups.prepare()
        except (OSError, CgroupError) as exc:
            raise BackendError(f"nsjail backend cannot start: {exc}") from exc
        self._reap(owner_alive)
        self._factory = self.Factory(
            s, self.binary, self.etc_dir, self.jail_policy_path, self.workspaces, self.cgroups,
            self.egress_resolver, shim,
        )  # fmt: skip

    def _reap(self, keep: Callable[[str], bool]) -> None:
        try:
            gone = self.workspaces.reap(keep)
            if self.cgroups is not None:
                gone += self.cgroups.reap(keep)
        except (OSError, CgroupError, WorkspaceError) as exc:
            raise BackendError(f"cannot remove leftover sandboxes: {exc}") from exc
        if gone:
            log.warning("nsjail: removed %d leftover sandbox resources", len(gone))
