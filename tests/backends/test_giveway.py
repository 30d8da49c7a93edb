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
