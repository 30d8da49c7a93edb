"""Background work that can wait gives way to the executions running.

A sandbox made ahead, or a used one torn down, costs far more CPU than a small
program, and on a small host such work that runs while a request is being finished
competes with that request's own remaining work (its records' fsync, its answer):
docker-gvisor's print(1) took 28 ms p50 with its replacement starting alongside,
19-21 ms with it waiting; on nsjail, where a sandbox is cheaper, the gain is small
(-0.2 to -0.4 ms settled, -1 ms back to back; docs/ARCHITECTURE.md).

`GiveWay` counts the executions running (`executing()` around each). `wait()`
returns once none has run for `quiet_s` (long enough for the gateway's own work
after one: its records, its answer), or after `max_s` in any case: under steady
load there is no quiet, and the work must still get done. The caller says what may
wait: a refill only while a sandbox of its kind is still waiting for the next
request (that request is served either way), a teardown only once nothing of its
program runs any more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterator

log = logging.getLogger(__name__)

QUIET_S = 0.02
MAX_S = 0.1
# How often the waiters' conditions are looked at: one timer for all of them, so
# that under steady load (no quiet, every wait running to MAX_S, several per
# execution) they cost one wake-up per look, not one each.
POLL_S = 0.005


class GiveWay:
    def __init__(self, max_s: float = MAX_S, quiet_s: float = QUIET_S) -> None:
        self.max_s = max_s
        self.quiet_s = quiet_s
        self.running = 0  # executions running now
        self._last_end = -1e9
        self.waited = 0  # waits that found executions in the way
        # (may it still wait, until when, whom to wake): looked at by one timer.
        self._waiters: list[tuple[Callable[[], bool], float, asyncio.Future[None]]] = []
        self._look: asyncio.TimerHandle | None = None
        self._look_loop: asyncio.AbstractEventLoop | None = None

    @contextlib.contextmanager
    def executing(self) -> Iterator[None]:
        """Around one execution: work that can wait gives way to it."""
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1
            self._last_end = time.monotonic()

    def busy(self) -> bool:
        return self.running > 0 or time.monotonic() - self._last_end < self.quiet_s

    async def wait(self, may_wait: Callable[[], bool] = lambda: True) -> bool:
        """Wait while executions run or have just ended, as long as `may_wait()`
        holds, for at most `max_s`; whether it waited at all."""
        if self.max_s <= 0 or not (self.busy() and may_wait()):
            return False
        loop = asyncio.get_running_loop()
        if self._look is not None and self._look_loop is not loop:
            # Left by a loop that has gone (a backend reused under another loop):
            # its waiters went with it.
            self._look.cancel()
            self._look = None
            self._waiters = []
        woken: asyncio.Future[None] = loop.create_future()
        self._waiters.append((may_wait, time.monotonic() + self.max_s, woken))
        if self._look is None:
            self._look_loop = loop
            self._look = loop.call_later(POLL_S, self._look_again, loop)
        try:
            await woken
        finally:
            woken.cancel()  # cancelled while waiting: the next look drops it
        self.waited += 1
        return True

    def _look_again(self, loop: asyncio.AbstractEventLoop) -> None:
        now, busy = time.monotonic(), self.busy()
        waiting = []
        for entry in self._waiters:
            may_wait, deadline, woken = entry
            if woken.done():
                continue
            try:
                still = busy and now < deadline and may_wait()
            except Exception:  # a broken condition must not hold the work back forever
                log.exception("give-way: a waiter's condition failed; it waits no more")
                still = False
            if still:
                waiting.append(entry)
            else:
                woken.set_result(None)
        self._waiters = waiting
        self._look = loop.call_later(POLL_S, self._look_again, loop) if waiting else None
