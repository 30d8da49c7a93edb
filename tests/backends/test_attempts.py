"""The retry loop on its own (fakes for the sandboxes): what is retried, what is not,
what is counted and returned, and that it stays within its tries and its deadline."""

from __future__ import annotations

import asyncio
import collections
import os
import subprocess

import pytest

from backends.attempts import STAGES, Source, StartFailures, acquire, exited, open_pidfd
from backends.base import BackendError, SandboxEvent, SandboxStartError


class Sandboxes:
    """A pool and a maker of fake sandboxes (names); `failures` are raised in turn."""

    def __init__(self, pooled: list[str], failures: list[BaseException]) -> None:
        self.pooled = collections.deque(pooled)
        self.failures = collections.deque(failures)
        self.dead: set[str] = set()
        self.discarded: list[str] = []
        self.made = 0
        self.slow_s = 0.0

    async def make(self) -> str:
        self.made += 1
        if self.slow_s:
            await asyncio.sleep(self.slow_s)
        if self.failures:
            raise self.failures.popleft()
        return f"fresh-{self.made}"

    def source(self) -> Source[str]:
        return Source(
            take=lambda: self.pooled.popleft() if self.pooled else None,
            dead=lambda name: "gone" if name in self.dead else "",
            make=self.make,
            discard=self.discarded.append,
        )


async def test_a_live_pooled_sandbox_is_used_as_is() -> None:
    box = Sandboxes(["pooled-1"], [])
    failures = StartFailures()
    got, events = await acquire(box.source(), 3, 10, failures)
    assert (got, events, box.made, failures.total) == ("pooled-1", (), 0, 0)


async def test_dead_pooled_sandboxes_are_replaced_and_recorded() -> None:
    box = Sandboxes(["a", "b", "c"], [])
    box.dead = {"a", "b"}
    failures = StartFailures()
    got, events = await acquire(box.source(), 1, 10, failures)
    assert got == "c" and box.discarded == ["a", "b"]
    assert [e.kind for e in events] == ["start_failed", "start_failed"]
    assert all(e.detail.startswith("dead: ") for e in events)
    assert failures.counts == {"dead": 2}


async def test_start_failures_are_retried_with_a_fresh_sandbox() -> None:
    box = Sandboxes([], [SandboxStartError("start", "no"), SandboxStartError("ready", "late")])
    failures = StartFailures()
    got, events = await acquire(box.source(), 3, 10, failures)
    assert got == "fresh-3" and box.made == 3
    assert [e.detail for e in events] == ["start: no", "ready: late"]
    assert failures.counts == {"start": 1, "ready": 1}


async def test_every_try_failing_is_one_error_carrying_each_failure() -> None:
    box = Sandboxes([], [SandboxStartError("create", f"no {i}") for i in range(5)])
    failures = StartFailures()
    with pytest.raises(SandboxStartError, match=r"\(3 tries\): no 2") as caught:
        await acquire(box.source(), 3, 10, failures)
    assert box.made == 3
    details = [e.detail for e in caught.value.events]
    assert details == ["create: no 0", "create: no 1", "create: no 2"]
    assert failures.counts == {"create": 3}


async def test_an_engine_that_is_down_is_not_tried_again() -> None:
    box = Sandboxes([], [SandboxStartError("create", "unreachable", retryable=False)])
    with pytest.raises(SandboxStartError, match="unreachable") as caught:
        await acquire(box.source(), 3, 10, StartFailures())
    assert box.made == 1 and not caught.value.retryable


@pytest.mark.parametrize("error", [BackendError("other"), RuntimeError("bug"), ValueError("x")])
async def test_other_errors_are_not_retried(error: Exception) -> None:
    box = Sandboxes([], [error])
    with pytest.raises(type(error)):
        await acquire(box.source(), 3, 10, StartFailures())
    assert box.made == 1


async def test_the_deadline_bounds_all_tries_together() -> None:
    box = Sandboxes([], [])
    box.slow_s = 30.0
    failures = StartFailures()
    with pytest.raises(SandboxStartError, match=r"no sandbox within 0\.2s") as caught:
        await acquire(box.source(), 3, 0.2, failures)
    assert box.made == 1
    assert [e.detail.split(":")[0] for e in caught.value.events] == ["deadline"]
    assert failures.counts == {"deadline": 1}


async def test_background_failures_reach_the_observer_and_stages_stay_bounded() -> None:
    seen: list[SandboxEvent] = []
    failures = StartFailures()
    failures.observer = seen.append
    failures.record(SandboxStartError("ready", "late"), background=True)
    failures.record(SandboxStartError("no-such-stage", "?"), background=True)
    failures.record(RuntimeError("odd"), background=True)
    failures.record(SandboxStartError("start", "in a request"))  # its request carries it
    assert [e.detail for e in seen] == ["ready: late", "other: ?", "other: odd"]
    assert set(failures.counts) <= set(STAGES) and failures.total == 4


def test_a_pidfd_tells_when_its_process_has_exited() -> None:
    child = subprocess.Popen(["sleep", "60"])
    fd = open_pidfd(child.pid)
    try:
        assert fd >= 0 and not exited(fd)
        child.kill()
        child.wait()
        assert exited(fd)
    finally:
        os.close(fd)
    assert exited(open_pidfd(child.pid))  # gone: -1, counted as exited
