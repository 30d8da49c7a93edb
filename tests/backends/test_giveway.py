"""GiveWay: work that can wait waits while executions run or have just ended, for a
bounded time, and only as long as its caller says it may."""

from __future__ import annotations

import asyncio
import time

from backends.giveway import GiveWay


async def test_no_execution_no_wait() -> None:
    give_way = GiveWay(max_s=30)
    assert not give_way.busy()
    assert await give_way.wait() is False
    assert give_way.waited == 0


async def test_waits_for_the_execution_and_a_quiet_moment_after_it() -> None:
    give_way = GiveWay(max_s=30, quiet_s=0.05)
    ended_at = 0.0

    async def execution() -> None:
        nonlocal ended_at
        with give_way.executing():
            await asyncio.sleep(0.1)
        ended_at = time.monotonic()

    running = asyncio.ensure_future(execution())
    await asyncio.sleep(0)  # the execution has begun
    assert give_way.running == 1 and give_way.busy()
    assert await give_way.wait() is True
    await running
    # Not before the execution ended, nor before the quiet moment after it.
    assert time.monotonic() - ended_at >= 0.05
    assert give_way.running == 0 and not give_way.busy()
    assert give_way.waited == 1


async def test_the_wait_is_bounded_under_steady_load() -> None:
    give_way = GiveWay(max_s=0.05)
    with give_way.executing():  # an execution that outlasts the bound
        began = time.monotonic()
        assert await give_way.wait() is True
        assert time.monotonic() - began >= 0.05
        assert give_way.busy()


async def test_it_stops_waiting_as_soon_as_the_caller_may_not_wait() -> None:
    give_way = GiveWay(max_s=30)
    allowed = True

    async def revoke() -> None:
        nonlocal allowed
        await asyncio.sleep(0.02)
        allowed = False  # e.g. the last sandbox waiting was taken, or closing

    with give_way.executing():
        revoker = asyncio.ensure_future(revoke())
        async with asyncio.timeout(5):  # not the 30 s bound
            assert await give_way.wait(lambda: allowed) is True
        await revoker
        assert await give_way.wait(lambda: False) is False
    assert give_way.waited == 1


async def test_an_execution_that_fails_still_ends() -> None:
    give_way = GiveWay(quiet_s=0)
    try:
        with give_way.executing():
            raise RuntimeError("sandbox failed")
    except RuntimeError:
        pass
    assert give_way.running == 0 and not give_way.busy()


async def test_many_waiters_share_one_look_and_all_go_once_it_is_quiet() -> None:
    give_way = GiveWay(max_s=30, quiet_s=0.01)
    with give_way.executing():
        waits = [asyncio.ensure_future(give_way.wait()) for _ in range(100)]
        await asyncio.sleep(0.05)
        assert not any(w.done() for w in waits)
        # One timer looks at all of them, not one sleeping task each (the default
        # loop's timer heap: this test's loop is its own, nothing else is scheduled).
        scheduled = asyncio.get_running_loop()._scheduled
        assert sum(1 for h in scheduled if not h.cancelled()) == 1
    async with asyncio.timeout(5):
        assert all(await asyncio.gather(*waits))
    assert give_way.waited == 100


async def test_a_cancelled_waiter_is_dropped_and_the_others_still_go() -> None:
    give_way = GiveWay(max_s=30, quiet_s=0)
    with give_way.executing():
        cancelled = asyncio.ensure_future(give_way.wait())
        other = asyncio.ensure_future(give_way.wait())
        await asyncio.sleep(0.02)
        cancelled.cancel()
        await asyncio.sleep(0.02)
        assert cancelled.cancelled() and not other.done()
    async with asyncio.timeout(5):
        assert await other is True
    assert give_way.waited == 1


async def test_a_condition_that_fails_stops_the_wait() -> None:
    give_way = GiveWay(max_s=30)

    def broken() -> bool:
        raise RuntimeError("condition failed")

    calls = iter([True])  # true on the first look (before waiting), then broken
    with give_way.executing():
        async with asyncio.timeout(5):
            assert await give_way.wait(lambda: next(calls, None) or broken()) is True


def test_a_wait_under_a_new_loop_is_not_stranded_by_one_that_went() -> None:
    """A backend's GiveWay used under one loop, then another (a loop closed with a
    wait still pending must not leave the next loop's waits without a look)."""
    give_way = GiveWay(max_s=30, quiet_s=0)

    async def abandon() -> None:
        with give_way.executing():
            pending = asyncio.ensure_future(give_way.wait())
            await asyncio.sleep(0.01)
            assert not pending.done()  # asyncio.run cancels it as the loop closes

    asyncio.run(abandon())

    async def again() -> bool:
        with give_way.executing():
            waiting = asyncio.ensure_future(give_way.wait())
            await asyncio.sleep(0.02)
        async with asyncio.timeout(5):
            return await waiting

    assert asyncio.run(again()) is True
