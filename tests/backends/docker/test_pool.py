"""The docker pool's policy, with fake starts and removals (the real ones are in
test_lifecycle.py, test_retry.py and the soak): sized from demand between a floor and
a ceiling, filled in parallel but bounded, a request takes over a start under way
rather than starting a second one, removals bounded and never lost."""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import pytest

from backends.base import Limits
from backends.docker.config import Shape
from backends.docker.pool import Background, Disposer, Pool

SHAPE = Shape.of(Limits(), "python")
OTHER = Shape.of(Limits(memory_mb=96), "python")
BASH = Shape.of(Limits(), "bash")
_names = itertools.count(1)


@dataclass(eq=False)
class Fake:
    shape: Shape
    name: str = field(default_factory=lambda: f"c{next(_names)}")
    created: float = field(default_factory=time.monotonic)


class Gauge:
    """Calls that wait for the test's gate; how many are waiting, and at most."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.gate.set()
        self.now = 0
        self.most = 0

    async def through(self) -> None:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            await self.gate.wait()
        finally:
            self.now -= 1


class Engine:
    """Starts and removals that finish when the test says so, counted."""

    def __init__(self) -> None:
        self.starts, self.removals = Gauge(), Gauge()
        self.gate, self.remove_gate = self.starts.gate, self.removals.gate
        self.made: list[Fake] = []
        self.removed: list[Any] = []

    @property
    def starting(self) -> int:
        return self.starts.now

    @property
    def removing(self) -> int:
        return self.removals.now

    async def make(self, shape: Shape) -> Any:
        await self.starts.through()
        self.made.append(container := Fake(shape))
        return container

    async def dispose(self, container: Any) -> None:
        await self.removals.through()
        self.removed.append(container)


def pool_of(engine: Engine, background: Background, **kw: Any) -> Pool:
    kw = {"max_size": 8, "fill_concurrency": 2, "demand_window_s": 10.0,
          "remove_concurrency": 2, **kw}  # fmt: skip
    size = kw.pop("size", 2)
    return Pool(size, 300, SHAPE, engine.make, engine.dispose, background, **kw)


async def settled(background: Background) -> None:
    await background.settle(10)


async def spin() -> None:
    """Let every task that can run, run (the fakes never sleep)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def starts_held(size: int = 1, fill: int = 2) -> tuple[Engine, Background, Pool]:
    """A pool of `size` whose starts wait for the test's gate (`fill` of them begun)."""
    engine, bg = Engine(), Background()
    engine.gate.clear()
    pool = pool_of(engine, bg, size=size, max_size=size, fill_concurrency=fill)
    pool.replenish()
    await spin()
    assert engine.starting == min(size, fill) and pool.filling == size
    return engine, bg, pool


async def test_the_pool_grows_with_demand_up_to_its_ceiling_and_back_to_its_floor() -> None:
    engine, bg = Engine(), Background()
    pool = pool_of(engine, bg, size=2, max_size=6, demand_window_s=0.5)
    assert pool.target() == 2  # no demand yet: the floor
    pool.start_latency_s = 0.1
    for _ in range(20):
        pool.want(SHAPE)  # 20 arrivals in 0.5 s: 40/s x 0.1 s = 4 containers
    assert pool.target() == 4
    pool.start_latency_s = 1.0
    assert pool.target() == 6  # 40 would be needed: the ceiling
    pool.replenish()
    await settled(bg)
    assert len(pool.ready) == 6
    # Once the arrivals are older than the window, the pool shrinks to its floor.
    await asyncio.sleep(0.6)
    pool.tick()
    await settled(bg)
    assert pool.target() == 2 and len(pool.ready) == 2
    assert len(engine.removed) == 4


async def test_no_pool_means_no_pool_whatever_the_ceiling() -> None:
    engine, bg = Engine(), Background()
    pool = pool_of(engine, bg, size=0, max_size=8)
    for _ in range(50):
        pool.want(SHAPE)
    pool.replenish()
    pool.tick()
    await settled(bg)
    assert pool.target() == 0 and engine.made == []


async def test_refills_run_in_parallel_but_never_more_than_the_bound() -> None:
    engine, bg, pool = await starts_held(size=6, fill=3)
    engine.gate.set()
    await settled(bg)
    assert engine.starts.most == 3 and len(pool.ready) == 6


async def test_a_request_takes_over_a_start_under_way_instead_of_starting_its_own() -> None:
    engine, _, pool = await starts_held()
    claim = asyncio.ensure_future(pool.claim(SHAPE, 30))
    await spin()
    assert not claim.done()
    engine.gate.set()
    container = await claim
    assert container is engine.made[0] and pool.claims == 1 and pool.misses == 0
    assert pool.ready == frozenset()  # it went to the request, not into the pool


async def test_a_request_never_waits_for_a_start_that_has_not_begun() -> None:
    engine, bg, pool = await starts_held(size=3, fill=1)
    first = asyncio.ensure_future(pool.claim(SHAPE, 30))  # takes over the one under way
    await spin()
    # The two queued starts have not begun: the next request starts its own at once.
    assert await pool.claim(SHAPE, 30) is None
    assert await pool.claim(OTHER, 30) is None  # and no start is of another shape's
    engine.gate.set()
    assert await first is not None
    await settled(bg)
    # The request that started its own took a queued start's place: 2 made, not 3.
    assert len(engine.made) == 2 and len(pool.ready) == 1


async def test_a_claimer_cancelled_as_its_container_arrives_leaves_it_in_the_pool() -> None:
    engine, bg, pool = await starts_held()
    claim = asyncio.ensure_future(pool.claim(SHAPE, 30))
    await spin()
    claim.cancel()
    engine.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await claim
    await settled(bg)
    assert pool.ready == frozenset({engine.made[0].name})  # nothing lost, nothing leaked


async def test_removals_are_bounded_queued_and_all_done_by_the_time_it_settles() -> None:
    engine, bg = Engine(), Background()
    engine.remove_gate.clear()
    pool = pool_of(engine, bg, remove_concurrency=2)
    used = [Fake(SHAPE) for _ in range(7)]
    for container in used:
        pool.disposer.put(container)
    await spin()
    assert engine.removing == 2 and pool.disposer.backlog == 5
    # One that may still run a program is removed at once, whatever is queued.
    urgent = Fake(SHAPE)
    pool.disposer.put(urgent, urgent=True)
    await spin()
    assert engine.removing == 3
    engine.remove_gate.set()
    await settled(bg)
    assert set(engine.removed) == {*used, urgent} and pool.disposer.backlog == 0
    assert engine.removals.most == 3


async def test_draining_removes_the_ready_and_the_queued_at_once() -> None:
    engine, bg = Engine(), Background()
    pool = pool_of(engine, bg, size=3, max_size=3, remove_concurrency=1)
    pool.replenish()
    await settled(bg)
    engine.remove_gate.clear()
    queued = [Fake(SHAPE) for _ in range(4)]
    for container in queued:
        pool.disposer.put(container)
    ready = set(pool._ready)
    await pool.drain()
    await spin()
    assert engine.removing == 3 + 4  # nothing waits its turn when closing
    engine.remove_gate.set()
    await settled(bg)
    assert set(engine.removed) == ready | set(queued) and pool.ready == frozenset()
    pool.replenish()
    assert pool.filling == 0  # closed: no more starts
    pool.open()  # started again: bounded removals, starts again
    engine.remove_gate.clear()
    for container in [Fake(SHAPE) for _ in range(3)]:
        pool.disposer.put(container)
    await spin()
    assert engine.removing == 1 and pool.disposer.backlog == 2
    engine.remove_gate.set()
    pool.replenish()
    await settled(bg)
    assert len(pool.ready) == 3


async def test_a_failed_start_ahead_backs_off_before_the_pool_tries_on_its_own() -> None:
    engine, bg = Engine(), Background()
    failures: list[BaseException] = []

    async def broken(shape: Shape) -> Any:
        raise RuntimeError("engine says no")

    pool = Pool(1, 300, SHAPE, broken, engine.dispose, bg, failures.append, max_size=1)
    pool.replenish()
    await settled(bg)
    assert len(failures) == 1 and "engine says no" in pool.fill_error
    pool.tick()  # within the back-off: no new try
    await settled(bg)
    assert len(failures) == 1


async def test_removals_give_way_to_a_start_under_way_but_release_at_once() -> None:
    engine, bg, pool = await starts_held(size=1)
    released: list[Fake] = []

    async def release(container: Any) -> None:
        released.append(container)

    pool.disposer = Disposer(engine.dispose, bg, 2, release, lambda: pool.starting > 0)
    used = Fake(SHAPE)
    pool.disposer.put(used)
    await spin()
    assert released == [used]  # stream, pidfds, egress: let go at once
    assert engine.removed == [] and engine.removals.most == 0  # the start goes first
    engine.gate.set()
    await settled(bg)
    assert engine.removed == [used] and len(pool.ready) == 1


async def ready_pool(**kw: Any) -> tuple[Engine, Background, Pool]:
    engine, bg = Engine(), Background()
    pool = pool_of(engine, bg, size=2, max_size=2, **kw)
    pool.replenish()
    await settled(bg)
    assert len(pool.ready) == 2
    return engine, bg, pool


async def polls() -> None:
    """Long enough for a waiting start to look several times (it never starts on
    time: the tests give it 30 s to wait)."""
    await asyncio.sleep(0.05)


async def test_a_start_ahead_gives_way_to_an_execution_while_its_shape_has_one_waiting() -> None:
    engine, bg, pool = await ready_pool(give_way_max_s=30)
    with pool.executing():
        assert pool.take(SHAPE) is not None  # one runs; the other still waits
        pool.replenish()
        await polls()
        assert len(engine.made) == 2 and pool.filling == 1 and engine.starting == 0
    await settled(bg)  # the execution ended: its replacement starts
    assert len(engine.made) == 3 and len(pool.ready) == 2 and pool.gave_way == 1


async def test_a_shape_with_nothing_waiting_starts_at_once_even_while_executions_run() -> None:
    engine, bg, pool = await ready_pool(give_way_max_s=30)
    with pool.executing():
        assert pool.take(SHAPE) is not None
        pool.replenish()
        await polls()
        engine.gate.clear()  # starts now stay under way until the test lets them end
        assert pool.take(SHAPE) is not None  # none left: the waiting start goes now
        pool.replenish()  # and the second one's replacement does not wait either
        await polls()
        assert engine.starting == 2
        engine.gate.set()
    await settled(bg)
    assert len(engine.made) == 4 and len(pool.ready) == 2


async def test_a_start_gives_way_no_longer_than_its_bound() -> None:
    engine, bg, pool = await ready_pool(give_way_max_s=0)
    with pool.executing():
        assert pool.take(SHAPE) is not None
        pool.replenish()
        await settled(bg)  # under steady load there is no quiet: it did not wait for one
        assert len(engine.made) == 3 and pool.gave_way == 0


async def test_removals_give_way_to_executions_and_are_all_done_once_they_end() -> None:
    engine, bg, pool = await ready_pool(give_way_max_s=30)
    with pool.executing():
        used = pool.take(SHAPE)
        assert used is not None
        pool.disposer.put(used)
        await polls()
        assert engine.removed == [] and engine.removals.most == 0
    await settled(bg)
    assert engine.removed == [used]


async def test_a_request_waits_for_a_start_under_way_no_longer_than_its_deadline() -> None:
    engine, bg, pool = await starts_held()
    assert await pool.claim(SHAPE, 0.05) is None  # the caller starts its own, in time
    engine.gate.set()
    await settled(bg)
    assert pool.ready == frozenset({engine.made[0].name})  # the late one is the pool's


async def test_the_pool_is_shared_among_the_shapes_asked_for_lately() -> None:
    engine, bg = Engine(), Background()
    pool = pool_of(engine, bg, size=4, max_size=4)
    assert pool.shares() == {SHAPE: 4}  # before any request: the default's
    for _ in range(6):
        pool.want(SHAPE)
        pool.want(BASH)
    pool.want(OTHER)  # once in 13: no share of 4
    assert pool.shares() == {SHAPE: 2, BASH: 2}
    pool.replenish()
    await settled(bg)
    assert sorted(c.shape.language for c in pool._ready) == ["bash", "bash", "python", "python"]
    for _ in range(16):
        pool.want(BASH)  # python ages out of the recent requests
    assert pool.shape == BASH and pool.shares() == {BASH: 4}
    pool.tick()
    await settled(bg)
    assert [c.shape for c in pool._ready] == [BASH] * 4
    removed = [c.shape for c in engine.removed]
    assert removed == [SHAPE, SHAPE]  # the unwanted ones, not the ones still wanted
    # A request of a shape the pool no longer holds starts its own; the pool's stay.
    assert pool.take(SHAPE) is None and len(pool.ready) == 4
