"""Getting a sandbox for a request: retry where nothing ran, notice the dead.

A sandbox can fail before the program is handed over to it: its creation, its
start, its network boundary, its launcher's readiness; or, made ahead, it can die
while it waits in the pool (its container exited, its nsjail process is gone).
None of that is the caller's doing and nothing of the caller's ran, so the backend
throws such a sandbox away and tries a fresh one, at most `start_attempts` times
and within `start_deadline_s` (backends/ceilings.py). Every failure is counted
by stage (a bounded label set, exported in /metrics) and returned as a
`start_failed` SandboxEvent (the gateway audits each as a `sandbox.event`). Once
the program has been handed over nothing is retried: the run is reported as it
ended.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import select
from collections.abc import Awaitable, Callable
from typing import Generic, NoReturn, TypeVar

from backends.base import BackendError, SandboxEvent, SandboxStartError

log = logging.getLogger(__name__)

T = TypeVar("T")

# The stages a start can fail in (the /metrics label; anything else is "other").
STAGES = ("create", "start", "boundary", "ready", "dead", "deadline", "other")
EVENT_KIND = "start_failed"


def stage_of(exc: BaseException) -> str:
    stage = getattr(exc, "stage", "other")
    return stage if stage in STAGES else "other"


class StartFailures:
    """Start failures of one backend: counted by stage, and told to the gateway
    when no request is there to carry them (a sandbox made ahead in the background)."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        # Set by the gateway: audits a failure seen outside any request.
        self.observer: Callable[[SandboxEvent], None] | None = None

    def record(self, exc: BaseException, *, background: bool = False) -> SandboxEvent:
        stage = stage_of(exc)
        self.counts[stage] += 1
        event = SandboxEvent(EVENT_KIND, f"{stage}: {exc}"[:1000])
        if background:
            self.report((event,))
        return event

    def report(self, events: tuple[SandboxEvent, ...]) -> None:
        """Tell the gateway of failures no request carries (already counted)."""
        for event in events:
            if self.observer is None:
                return
            try:
                self.observer(event)
            except Exception:  # the audit log's trouble is reported by its own health
                log.exception("cannot report a sandbox start failure")

    @property
    def total(self) -> int:
        return sum(self.counts.values())


class Source(Generic[T]):
    """Where a backend's sandboxes come from, as the retry loop needs it."""

    def __init__(
        self,
        take: Callable[[], T | None],
        dead: Callable[[T], str],
        make: Callable[[], Awaitable[T]],
        discard: Callable[[T], None],
    ) -> None:
        self.take = take  # a pooled sandbox (not yet checked), or None
        self.dead = dead  # why a pooled sandbox can no longer be used, or ""
        self.make = make  # a fresh one; raises SandboxStartError
        self.discard = discard  # dispose of one in the background


async def acquire(
    source: Source[T], attempts: int, deadline_s: float, failures: StartFailures
) -> tuple[T, tuple[SandboxEvent, ...]]:
    """A live sandbox and the start failures met on the way (raises
    SandboxStartError carrying them when every try failed)."""
    events: list[SandboxEvent] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    last: BaseException | None = None
    for _ in range(attempts):
        # Pooled sandboxes first: each dead one is replaced, not counted as a try
        # (the pool holds a bounded number of them).
        while (pooled := source.take()) is not None:
            reason = source.dead(pooled)
            if not reason:
                return pooled, tuple(events)
            source.discard(pooled)
            events.append(failures.record(SandboxStartError("dead", reason)))
        left = deadline - loop.time()
        if left <= 0:
            break
        try:
            async with asyncio.timeout(left):
                return await source.make(), tuple(events)
        except SandboxStartError as exc:
            last = exc
            events.append(failures.record(exc))
            if not exc.retryable:
                break
        except TimeoutError:
            last = SandboxStartError("deadline", f"no sandbox within {deadline_s:g}s")
            events.append(failures.record(last))
            break
    detail = str(last) if last is not None else f"no sandbox within {deadline_s:g}s"
    tries = sum(1 for e in events if not e.detail.startswith("dead:"))
    raise SandboxStartError(
        stage_of(last) if last is not None else "deadline",
        f"no sandbox could be started ({tries} tries): {detail}",
        events=tuple(events),
        retryable=last.retryable if isinstance(last, SandboxStartError) else False,
    )


def raise_start_error(stage: str, exc: BaseException) -> NoReturn:
    """Re-raise a failure met while making a sandbox: a backend error as a
    SandboxStartError of `stage` (unless it already is one), anything else as is."""
    if isinstance(exc, BackendError) and not isinstance(exc, SandboxStartError):
        retryable = getattr(exc, "retryable", True)
        raise SandboxStartError(stage, str(exc), retryable=retryable) from exc
    raise exc


def open_pidfd(pid: int) -> int:
    """A descriptor that becomes readable when process `pid` has exited (-1: gone)."""
    try:
        return os.pidfd_open(pid)
    except OSError:
        return -1


def exited(pidfd: int) -> bool:
    """True once the process behind `pidfd` has exited (non-blocking)."""
    if pidfd < 0:
        return True
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(0))


def close_fd(fd: int) -> None:
    if fd >= 0:
        with contextlib.suppress(OSError):
            os.close(fd)
