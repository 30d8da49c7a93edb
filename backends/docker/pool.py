"""Fresh containers started ahead of requests, each used for exactly one execution.

Starting a container (runc or runsc setting up namespaces, cgroups, mounts; the
launcher's interpreter) costs far more than running a small program, so some are
made ahead: created, attached, started, their launcher waiting for a request. None
has run user code; each is taken once, and removed after its one execution; a
taken container is replaced in the background.

What the engine fixes at creation (memory, CPUs, processes, disk, and the
language whose interpreter a container starts ahead) is the container's *shape*,
and only a request of the same shape can use it. The pool is shared among the
shapes asked for at least `SHARE_MIN` times in the last `RECENT` requests, in
proportion to their counts (largest remainder, backends/demand.py; the default
request's shape when there is none), so a
steady workload, or a steady mix of languages, is served from it and an unusual
request simply starts its own container.

How many: enough to cover the requests that arrive while replacements start
(Little's law: the arrival rate over the last `demand_window_s` times the measured
start latency), never fewer than the floor (`pool_size`) nor more than the ceiling
(`pool_max_size`); as the arrivals of a burst age out of the window the pool shrinks
back to the floor. Replacements start in parallel, at most `fill_concurrency` at
once (more would only slow each other down on the engine). A request that finds
the pool empty takes over a replacement already being started (it is ready sooner
than a fresh start would be, and nothing is started twice); if none is under way
it starts its own at once, never queued behind the pool's, and one replacement the
pool had queued is dropped in its place.

A start ahead also gives way to the executions running now, as long as its shape
still has a container waiting (the next request of it is served either way): it
begins once none has run for a moment, or after at most a tenth of a second
(backends/giveway.py, shared with the nsjail pool); removals wait
for those executions too (as for starts: until `YIELD_BACKLOG` are queued). A container
start (the engine, the runtime, the launcher's interpreter) is far more CPU than a
small program, and on a small host one that starts while a request runs slows that
request down (docker-gvisor's print(1): 28 ms p50 with its replacement starting
alongside, 22 ms with it waiting here). A shape with nothing left waiting starts
at once.

Removal of used containers (`Disposer`) is off the request path and bounded:
what the gateway holds for one (stream, pidfds, egress session) is let go at once;
the engine's removal runs at most `remove_concurrency` at once and gives way while a
start is under way (unless `YIELD_BACKLOG` are queued), so removals never take the
engine threads and engine time that the next requests' starts need; the queue is
always emptied (settling and closing the backend wait for it). A container that may
still run a program (its execution did not end normally) is removed at once, never
queued.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from backends.demand import split
from backends.docker.config import Shape
from backends.docker.sandbox import Container
from backends.giveway import MAX_S, GiveWay

log = logging.getLogger(__name__)

RECENT = 16
# Requests of a shape among the RECENT before the pool holds any of it.
SHARE_MIN = 2
# Before the first start is measured: a runc start on a quiet host, roughly.
INITIAL_START_S = 0.5
# Weight of the newest start in the start latency's moving average.
START_WEIGHT = 0.3
# How often the pool follows demand on its own (shrinks, ages, refills).
TICK_S = 1.0
# After a failed start ahead, the pool waits before trying again on its own (a broken
# engine is not hammered); doubled per consecutive failure, up to the maximum.
BACKOFF_S, BACKOFF_MAX_S = 1.0, 60.0
# Removals give way to starts until this many are queued (then they go on at their
# own bounded pace whatever starts), checking this often.
YIELD_BACKLOG = 16
YIELD_POLL_S = 0.02


class Background:
    """Tasks that must finish even if whoever started them is cancelled."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Future[None]] = set()

    def start(self, coro: Coroutine[Any, Any, None]) -> asyncio.Future[None]:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def settle(self, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            while self.tasks:
                await asyncio.gather(*self.tasks, return_exceptions=True)


class Disposer:
    """Removes containers in the background, at most `concurrency` at once, giving
    way to starts (see the module's docstring)."""

    def __init__(
        self,
        dispose: Callable[[Container], Awaitable[None]],
        background: Background,
        concurrency: int,
        release: Callable[[Container], Awaitable[None]] | None = None,
        starting: Callable[[], bool] = lambda: False,
    ) -> None:
        self._dispose = dispose
        self._release = release
        self._starting = starting
        self._background = background
        self.concurrency = concurrency
        self._queue: collections.deque[Container] = collections.deque()
        self._running = 0
        self.flushing = False

    @property
    def backlog(self) -> int:
        return len(self._queue)

    def put(self, container: Container, *, urgent: bool = False) -> None:
        """Remove `container`; `urgent`: now, whatever is queued or starting (it may
        still run a program)."""
        if self._release is not None and not urgent:
            self._background.start(self._release(container))
        if urgent or self.flushing:
            self._background.start(self._dispose(container))
        elif self._running < self.concurrency:
            self._running += 1
            self._background.start(self._worker(container))
        else:
            self._queue.append(container)

    def flush(self) -> None:
        """Remove everything queued at once, from now on (the backend is closing)."""
        self.flushing = True
        while self._queue:
            self._background.start(self._dispose(self._queue.popleft()))

    async def _worker(self, container: Container) -> None:
        try:
            while True:
                # Starts are the next requests' critical path, removals nobody's:
                # wait while one is under way, unless the backlog is long.
                while self._starting() and len(self._queue) < YIELD_BACKLOG:
                    if self.flushing:
                        break
                    await asyncio.sleep(YIELD_POLL_S)
                await self._dispose(container)
                if not self._queue:
                    return
                container = self._queue.popleft()
        finally:
            self._running -= 1


@dataclass(eq=False)
class _Fill:
    """A container being started ahead; a request that found the pool empty may
    claim it (`claimed`) and gets it as soon as it is ready."""

    shape: Shape
    started: bool = False
    dropped: bool = False  # a request started its own instead: not to be made
    claimed: asyncio.Future[Container | None] | None = None
    task: asyncio.Future[None] | None = field(default=None, repr=False)


class Pool:
    def __init__(
        self,
        size: int,
        max_age_s: float,
        shape: Shape,
        make: Callable[[Shape], Awaitable[Container]],
        dispose: Callable[[Container], Awaitable[None]],
        background: Background,
        failed: Callable[[BaseException], object] = lambda exc: None,
        *,
        max_size: int = 0,
        fill_concurrency: int = 2,
        demand_window_s: float = 10.0,
        remove_concurrency: int = 2,
        release: Callable[[Container], Awaitable[None]] | None = None,
        give_way_max_s: float = MAX_S,
    ) -> None:
        self.size = size  # the floor; 0: no pool at all
        self.max_size = max(size, max_size) if size else 0
        self.max_age_s = max_age_s
        self.demand_window_s = demand_window_s
        self.default_shape = shape
        self._make = make
        self._background = background
        self.starting = 0  # starts under way, the pool's and requests' own
        # Removals wait for starts (the next requests' path) and for executions.
        self.disposer = Disposer(
            dispose, background, remove_concurrency, release, self._removals_wait
        )
        self._failed = failed  # a container made ahead failed to start
        self._slots = asyncio.Semaphore(fill_concurrency)
        self._ready: collections.deque[Container] = collections.deque()
        self._recent: collections.deque[Shape] = collections.deque(maxlen=RECENT)
        self._arrivals: collections.deque[float] = collections.deque()
        self._fills: list[_Fill] = []
        self.start_latency_s = INITIAL_START_S
        self._failures = 0
        self._retry_at = 0.0
        self.closing = False
        self.fill_error = ""
        self.hits = 0
        self.misses = 0
        self.claims = 0  # requests served by a start already under way
        # Executions running now in containers of this pool's backend: starts ahead
        # and removals that can wait give way to them.
        self.give_way = GiveWay(give_way_max_s)

    @property
    def ready(self) -> frozenset[str]:
        """Names of the containers waiting for a request."""
        return frozenset(c.name for c in self._ready)

    @property
    def filling(self) -> int:
        return len(self._fills)

    # --- demand ----------------------------------------------------------------

    def want(self, shape: Shape) -> None:
        """A request of this shape arrived (the pool follows the demand)."""
        self._recent.append(shape)
        self._arrivals.append(time.monotonic())

    def forget_demand(self) -> None:
        """What came so far was not demand (the backend's own start-up runs)."""
        self._recent.clear()
        self._arrivals.clear()

    @property
    def shape(self) -> Shape:
        """The shape requested most lately (ties: the latest)."""
        shares = self.shares(RECENT)
        return max(shares, key=shares.__getitem__, default=self.default_shape)

    def shares(self, size: int | None = None) -> dict[Shape, int]:
        """How many of the target (or of `size`) each shape should have."""
        size = self.target() if size is None else size
        # A shape asked for once lately is an unusual request, not demand: it starts
        # its own container, and the pool does not churn after it.
        counts = {s: n for s, n in collections.Counter(self._recent).items() if n >= SHARE_MIN}
        if not counts:
            return {self.default_shape: size} if size > 0 else {}
        last = {shape: i for i, shape in enumerate(self._recent)}
        return split(size, counts, last)

    def _held(self, shape: Shape) -> int:
        """Containers of this shape waiting or being started for the pool (a start
        dropped for a request's own still counts until its turn comes)."""
        waiting = sum(1 for c in self._ready if c.shape == shape)
        return waiting + sum(1 for f in self._fills if f.shape == shape)

    def target(self) -> int:
        """How many containers should be ready or starting now."""
        if not self.size:
            return 0
        horizon = time.monotonic() - self.demand_window_s
        while self._arrivals and self._arrivals[0] < horizon:
            self._arrivals.popleft()
        rate = len(self._arrivals) / self.demand_window_s
        need = math.ceil(rate * self.start_latency_s)
        return min(max(self.size, need), self.max_size)

    # --- taking ------------------------------------------------------------------

    def take(self, shape: Shape) -> Container | None:
        """A waiting container of this shape, or None (the caller starts one).
        Whether it is still alive is the caller's check (backends/attempts.py), so
        that a container that died while it waited is recorded, not just dropped."""
        now = time.monotonic()
        found = None
        shares = self.shares()
        for container in list(self._ready):
            stale = now - container.created >= self.max_age_s
            if stale or not shares.get(container.shape):
                self._ready.remove(container)
                self.disposer.put(container)
            elif found is None and container.shape == shape:
                self._ready.remove(container)
                found = container
        if found is None:
            self.misses += 1
        else:
            self.hits += 1
        return found

    async def claim(self, shape: Shape, timeout_s: float) -> Container | None:
        """A waiting container of this shape; else the next one of the starts
        already under way for it (waiting for it at most `timeout_s`; after that it
        goes to the pool); else None (the caller starts its own). Never waits for a
        start that has not begun."""
        if (found := self.take(shape)) is not None:
            return found
        mine = [f for f in self._fills if f.claimed is None and f.shape == shape]
        fill = next((f for f in mine if f.started), None)
        if fill is None:
            # Its own start goes at once; one the pool had queued for it is not made
            # too (a start more would only slow the others down).
            if queued := next((f for f in mine if not f.dropped), None):
                queued.dropped = True
            return None
        fill.claimed = claimed = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait((claimed,), timeout=timeout_s)
        except asyncio.CancelledError:
            # Handed to us just as we were cancelled: it waits for the next request.
            if claimed.done() and (container := claimed.result()) is not None:
                self._keep(container)
            claimed.cancel()
            raise
        if not claimed.done():
            claimed.cancel()  # too late for us: the start's container goes to the pool
            return None
        if (container := claimed.result()) is not None:
            self.misses -= 1  # counted as a claim, not as a container started for it
            self.claims += 1
        return container

    # --- filling -----------------------------------------------------------------

    async def track(self, start: Awaitable[Container]) -> Container:
        """A start under way (removals give way to it)."""
        self.starting += 1
        try:
            return await start
        finally:
            self.starting -= 1

    def replenish(self) -> None:
        """Start what the target asks for (in the background, bounded)."""
        if self.closing:
            return
        room = self.max_size - len(self._ready) - len(self._fills)
        for shape, share in self.shares().items():
            for _ in range(min(share - self._held(shape), room)):
                fill = _Fill(shape)
                self._fills.append(fill)
                fill.task = self._background.start(self._fill_one(fill))
                room -= 1

    def executing(self) -> contextlib.AbstractContextManager[None]:
        """Around one execution: starts ahead that can wait give way to it."""
        return self.give_way.executing()

    @property
    def gave_way(self) -> int:
        """Starts ahead that waited for executions to end."""
        return self.give_way.waited

    def _removals_wait(self) -> bool:
        return self.starting > 0 or self.give_way.busy()

    async def _give_way(self, fill: _Fill) -> None:
        """Wait while executions run, if a container of this shape is waiting anyway."""
        await self.give_way.wait(
            lambda: (
                not (self.closing or fill.dropped or fill.claimed is not None)
                and any(c.shape == fill.shape for c in self._ready)
            )
        )

    async def _fill_one(self, fill: _Fill) -> None:
        container: Container | None = None
        try:
            await self._give_way(fill)
            async with self._slots:
                if self.closing or fill.dropped or not self.shares().get(fill.shape):
                    return  # no longer wanted before it began
                fill.started = True
                t0 = time.monotonic()
                try:
                    container = await self.track(self._make(fill.shape))
                except Exception as exc:  # a background task: nothing else would see it
                    self._failures += 1
                    self._retry_at = time.monotonic() + min(
                        BACKOFF_MAX_S, BACKOFF_S * 2 ** (self._failures - 1)
                    )
                    self.fill_error = str(exc)
                    log.warning("docker: cannot start a container ahead: %s", exc)
                    self._failed(exc)
                    return
                elapsed = time.monotonic() - t0
                self.start_latency_s += START_WEIGHT * (elapsed - self.start_latency_s)
                self._failures = 0
                self.fill_error = ""
        finally:
            self._fills.remove(fill)
            claimed = fill.claimed
            if claimed is not None and not claimed.done():
                claimed.set_result(container)
                container = None
        if container is not None:
            self._keep(container)

    def _keep(self, container: Container) -> None:
        """A ready container nobody claimed: into the pool, if it is still wanted."""
        # A shape still wanted at all (beyond its share, `tick` trims it).
        room = len(self._ready) + len(self._fills) < self.max_size
        if self.closing or not room or not self.shares().get(container.shape):
            self.disposer.put(container)
        else:
            self._ready.append(container)

    # --- following demand over time ----------------------------------------------

    def tick(self) -> None:
        """Shrink to the target (the oldest first), drop the stale, refill."""
        if self.closing:
            return
        now = time.monotonic()
        shares = self.shares()
        excess = {shape: self._held(shape) - shares.get(shape, 0) for shape in self._shapes()}
        for container in list(self._ready):  # the oldest first
            if excess[container.shape] > 0 or now - container.created >= self.max_age_s:
                self._ready.remove(container)
                self.disposer.put(container)
                excess[container.shape] -= 1
        if now >= self._retry_at:
            self.replenish()

    def _shapes(self) -> set[Shape]:
        return {c.shape for c in self._ready} | {f.shape for f in self._fills}

    async def maintain(self) -> None:
        """Run `tick` every TICK_S until cancelled."""
        while True:
            await asyncio.sleep(TICK_S)
            try:
                self.tick()
            except Exception:  # the pool must go on following demand
                log.exception("docker: pool maintenance")

    def open(self) -> None:
        """Fill and remove at the usual pace again (the backend starts, maybe anew)."""
        self.closing = False
        self.disposer.flushing = False

    async def drain(self) -> None:
        """Stop filling and remove every waiting container (and the queued ones)."""
        self.closing = True
        self.disposer.flush()
        while self._ready:
            self.disposer.put(self._ready.popleft(), urgent=True)
