"""Background work that can wait gives way to the executions running.

A sandbox made ahead, or a used one torn down, costs far more CPU than a small
program, and on a small host such work that runs while a request is being finished
slows that request down: measured on 2 cores, the nsjail pool's refill, the used
sandbox's teardown and its egress boundary's close, started the moment the program
had ended, added 3.8 ms to a settled `print(1)` through the gateway (the records'
fsync and the answer waited for the cores); docker-gvisor's print(1) took 28 ms
p50 with its replacement starting alongside, 19-21 ms with it waiting.

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
import time
from collections.abc import Callable, Iterator

QUIET_S = 0.02
MAX_S = 0.1
POLL_S = 0.005


class GiveWay:
    def __init__(self, max_s: float = MAX_S, quiet_s: float = QUIET_S) -> None:
        self.max_s = max_s
        self.quiet_s = quiet_s
        self.running = 0  # executions running now
        self._last_end = -1e9
        self.waited = 0  # waits that found executions in the way

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
        deadline = time.monotonic() + self.max_s
        waited = False
        while self.busy() and may_wait() and time.monotonic() < deadline:
            waited = True
            await asyncio.sleep(POLL_S)
        self.waited += waited
        return waited
