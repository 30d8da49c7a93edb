"""Fresh containers started ahead of requests, each used for exactly one execution.

Starting a container (runc or runsc setting up namespaces, cgroups, mounts; the
launcher's interpreter) costs far more than running a small program, so a few are
made ahead: created, attached, started, their launcher waiting for a request. None
has run user code; each is taken once, and removed after its one execution; a
taken container is replaced in the background.

What the engine fixes at creation (memory, CPUs, processes, disk) is the
container's *shape*, and only a request of the same shape can use it. The pool
makes the shape most requested lately (of the last `RECENT` requests; the default
request's shape to begin with), so a steady workload is served from it and an
unusual request simply starts its own container.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from backends.docker.config import Shape
from backends.docker.sandbox import Container

log = logging.getLogger(__name__)

RECENT = 16


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
    ) -> None:
        self.size = size
        self.max_age_s = max_age_s
        self.shape = shape
        self._make = make
        self._dispose = dispose
        self._background = background
        self._failed = failed  # a container made ahead failed to start
        self._ready: collections.deque[Container] = collections.deque()
        self._recent: collections.deque[Shape] = collections.deque(maxlen=RECENT)
        self._filling = 0
        self.closing = False
        self.fill_error = ""
        self.hits = 0
        self.misses = 0

    @property
    def ready(self) -> frozenset[str]:
        """Names of the containers waiting for a request."""
        return frozenset(c.name for c in self._ready)

    def want(self, shape: Shape) -> None:
        """A request of this shape arrived (the pool follows the demand)."""
        self._recent.append(shape)
        self._follow_demand()

    def take(self, shape: Shape) -> Container | None:
        """A waiting container of this shape, or None (the caller starts one).
        Whether it is still alive is the caller's check (backends/attempts.py), so
        that a container that died while it waited is recorded, not just dropped."""
        now = time.monotonic()
        found = None
        for container in list(self._ready):
            stale = now - container.created >= self.max_age_s
            if stale or container.shape != self.shape:
                self._ready.remove(container)
                self._background.start(self._dispose(container))
            elif found is None and container.shape == shape:
                self._ready.remove(container)
                found = container
        if found is None:
            self.misses += 1
        else:
            self.hits += 1
        return found

    def _follow_demand(self) -> None:
        counts = collections.Counter(self._recent)
        top, top_count = counts.most_common(1)[0]
        if top != self.shape and top_count > counts.get(self.shape, 0):
            self.shape = top

    def replenish(self) -> None:
        while not self.closing and len(self._ready) + self._filling < self.size:
            self._filling += 1
            self._background.start(self._fill_one(self.shape))

    async def _fill_one(self, shape: Shape) -> None:
        try:
            container = await self._make(shape)
        except Exception as exc:  # a background task: nothing else would see it
            self.fill_error = str(exc)
            log.warning("docker: cannot start a container ahead: %s", exc)
            self._failed(exc)
            return
        finally:
            self._filling -= 1
        self.fill_error = ""
        if self.closing or shape != self.shape:
            await self._dispose(container)
        else:
            self._ready.append(container)

    async def drain(self) -> None:
        """Stop filling and remove every waiting container."""
        self.closing = True
        while self._ready:
            await self._dispose(self._ready.popleft())

    @property
    def filling(self) -> int:
        return self._filling
