"""The embedded engine: rego-cpp (regopy) in-process, compiled once, one thread.

Queries run one at a time on a dedicated thread (rego-cpp is not known to be
thread-safe), under the caller's deadline. rego-cpp cannot be interrupted, so a
query that overruns its deadline keeps running; what happens then:

- the caller gets PolicyEngineError("unavailable") at the deadline (fail closed);
- the overrunning thread is retired and a fresh thread with its own compiled
  copy of the same policy takes every later request, so one stuck query does
  not wedge the engine; requests already queued behind it time out too;
- retired threads are daemons that exit once their query returns; while
  `max_overdue` of them are still running, decide() and health() refuse at once
  rather than pile up more runaway threads and CPU.

A policy that makes rego-cpp crash (it aborts or segfaults on some valid Rego)
is caught at start-up by compiling and probing it in a throw-away process first
(see preflight.py); an input-dependent crash during a query cannot be caught
in-process. Calling start() again recompiles and swaps only once the new policy
is ready; `reload.PolicyReloader` does that when the files change. Each lane
carries the revision it compiled, so an answer names the policy that decided it
even while a reload swaps lanes.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import regopy

from gateway.policy.base import EngineAnswer, PolicyEngineError, json_kind
from gateway.policy.preflight import preflight
from gateway.policy.rego import CompiledPolicy
from gateway.policy.sources import PolicySources, load_sources

log = logging.getLogger(__name__)

_Job = tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]


class _Lane:
    """One daemon thread owning one compiled policy; rego-cpp objects never leave it.

    A daemon thread rather than a ThreadPoolExecutor: executor threads are joined
    at interpreter exit, so a runaway query would hold up the gateway's shutdown.
    """

    def __init__(self, sources: PolicySources, name: str) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._policy: CompiledPolicy | None = None
        self.revision = sources.revision
        # Set while a job runs; read from the event loop to spot overruns.
        self.busy_since: float | None = None
        self.current: Future[Any] | None = None  # the job running now
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()
        self.ready = self.submit(self._compile, sources)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        future: Future[Any] = Future()
        self._jobs.put((future, fn, args))
        return future

    def decide(self, input: dict[str, Any]) -> Future[Any]:
        return self.submit(self._evaluate, input)

    def review(self, input: dict[str, Any]) -> Future[Any]:
        return self.submit(self._review, input)

    def probe(self) -> Future[Any]:
        return self.submit(self._probe)

    def overdue(self, limit_s: float) -> bool:
        since = self.busy_since
        return since is not None and time.monotonic() - since >= limit_s

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def join(self) -> None:
        self._thread.join()

    def stop(self) -> None:
        """Finish what is queued, then exit and free the policy on this thread."""
        self._jobs.put(None)

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn, args = job
            if not future.set_running_or_notify_cancel():
                continue  # the caller gave up while it was queued
            self.busy_since = time.monotonic()
            self.current = future
            try:
                result = fn(*args)
            except PolicyEngineError as exc:
                future.set_exception(exc)
            except Exception as exc:  # an engine fault, not the policy's answer
                future.set_exception(
                    PolicyEngineError("unavailable", f"policy engine error: {exc!r}")
                )
            else:
                future.set_result(result)
            finally:
                self.busy_since = None
                self.current = None
        self._policy = None

    def _compile(self, sources: PolicySources) -> None:
        policy = CompiledPolicy(sources)
        policy.probe()
        self._policy = policy

    def _evaluate(self, input: dict[str, Any]) -> Any:
        if self._policy is None:
            raise PolicyEngineError("unavailable", "policy evaluator did not start")
        return self._policy.evaluate(input)

    def _review(self, input: dict[str, Any]) -> Any:
        if self._policy is None:
            raise PolicyEngineError("unavailable", "policy evaluator did not start")
        return self._policy.review(input)

    def _probe(self) -> None:
        if self._policy is None:
            raise PolicyEngineError("unavailable", "policy evaluator did not start")
        self._policy.probe()


class EmbeddedEngine:
    """PolicyEngine over the Rego files in `path`, evaluated by rego-cpp."""

    def __init__(
        self,
        path: Path,
        timeout_ms: int,
        *,
        max_overdue: int = 2,
        isolate_compile: bool = True,
    ) -> None:
        self._path = path
        self._timeout_s = timeout_ms / 1000
        self._max_overdue = max_overdue
        self._isolate_compile = isolate_compile
        self._sources: PolicySources | None = None
        self._lane: _Lane | None = None
        self._overdue: list[_Lane] = []
        self._lanes_started = 0
        self._closed = False
        self.revision = ""

    @property
    def overdue_evaluations(self) -> int:
        """Evaluations still running past their deadline on retired threads."""
        self._overdue = [lane for lane in self._overdue if lane.running]
        return len(self._overdue)

    async def wait_overdue(self) -> None:
        """Wait until every overdue evaluation has returned (tests, orderly exits)."""
        for lane in list(self._overdue):
            await asyncio.to_thread(lane.join)
        self._overdue = [lane for lane in self._overdue if lane.running]

    async def start(self) -> None:
        """Load, check and compile the policy; on success it serves every later decide().

        Calling it again compiles the files anew and swaps only once the new
        policy is ready (hot reload will build on this), so a broken edit keeps
        the running policy and raises.
        """
        if self._closed:
            raise PolicyEngineError("unavailable", "policy engine is closed")
        sources = await asyncio.to_thread(load_sources, self._path)
        if self._isolate_compile:
            await preflight(sources)
        lane = await self._compile_lane(sources)
        previous, self._lane = self._lane, lane
        if previous is not None:
            previous.stop()
        self._sources = sources
        self.revision = sources.revision
        log.info(
            "embedded policy engine ready: %d modules from %s, revision %s",
            len(sources.modules),
            self._path,
            self.revision[:12],
        )

    async def _compile_lane(self, sources: PolicySources) -> _Lane:
        lane = self._new_lane(sources)
        try:
            await asyncio.wrap_future(lane.ready)
        except BaseException:
            lane.stop()
            raise
        return lane

    def _new_lane(self, sources: PolicySources) -> _Lane:
        self._lanes_started += 1
        return _Lane(sources, name=f"rego-{self._lanes_started}")

    async def decide(self, input: dict[str, Any]) -> EngineAnswer:
        lane = self._usable_lane()
        future = lane.decide(input)
        try:
            value = await asyncio.wait_for(asyncio.wrap_future(future), self._timeout_s)
        except TimeoutError:
            self._retire_if_overdue(lane, future)
            raise PolicyEngineError(
                "unavailable", f"no policy decision within {self._timeout_s * 1000:.0f} ms"
            ) from None
        if not isinstance(value, dict):
            raise PolicyEngineError(
                "invalid", f"data.execgate.decision is {json_kind(value)}, not an object"
            )
        return EngineAnswer(value, lane.revision)

    async def review(self, input: dict[str, Any]) -> dict[str, Any] | None:
        lane = self._usable_lane()
        future = lane.review(input)
        try:
            value = await asyncio.wait_for(asyncio.wrap_future(future), self._timeout_s)
        except TimeoutError:
            self._retire_if_overdue(lane, future)
            raise PolicyEngineError(
                "unavailable", f"no policy review within {self._timeout_s * 1000:.0f} ms"
            ) from None
        if value is not None and not isinstance(value, dict):
            raise PolicyEngineError(
                "invalid", f"data.execgate.review is {json_kind(value)}, not an object"
            )
        return value

    async def health(self) -> tuple[bool, str]:
        try:
            lane = self._usable_lane()
            await asyncio.wait_for(asyncio.wrap_future(lane.probe()), self._timeout_s)
        except TimeoutError:
            return False, f"policy probe took over {self._timeout_s * 1000:.0f} ms"
        except PolicyEngineError as exc:
            return False, exc.message
        return True, f"embedded rego-cpp {regopy.__version__}, revision {self.revision[:12]}"

    async def close(self) -> None:
        self._closed = True
        for lane in [self._lane, *self._overdue]:
            if lane is not None:
                lane.stop()
        self._lane = None
        self._overdue = []

    def _usable_lane(self) -> _Lane:
        if self._closed:
            raise PolicyEngineError("unavailable", "policy engine is closed")
        if self._lane is None:
            raise PolicyEngineError("unavailable", "policy engine is not started")
        if (overdue := self.overdue_evaluations) >= self._max_overdue:
            raise PolicyEngineError(
                "unavailable",
                f"{overdue} policy evaluations are still running past their deadline",
            )
        return self._lane

    def _retire_if_overdue(self, lane: _Lane, future: Future[Any]) -> None:
        # Only the lane in service, and only if the query it runs has overrun (not
        # the queue in front of this caller: a burst must not churn threads). The
        # caller's own query still running at its deadline has, whatever the clock
        # says of when its thread picked it up.
        if lane is not self._lane:
            return
        if lane.current is not future and not lane.overdue(self._timeout_s):
            return
        assert self._sources is not None
        log.warning(
            "a policy evaluation overran %.0f ms; moving to a fresh evaluator thread",
            self._timeout_s * 1000,
        )
        lane.stop()
        self._overdue.append(lane)
        # Requests queue behind the new lane's compile (milliseconds) under their
        # own deadlines; a compile failure shows up as their error.
        self._lane = self._new_lane(self._sources)
