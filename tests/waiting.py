"""Waiting for a condition in tests, never for a time.

The bound is there only to fail a hung test: it is far beyond any honest wait on
a loaded machine, so reaching it says "this never happened", not "too slow"."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

HUNG_S = 60.0


async def until(
    predicate: Callable[[], bool | Awaitable[bool]], timeout_s: float = HUNG_S, what: str = ""
) -> None:
    """Return once `predicate()` (sync or async) is true; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        assert time.monotonic() < deadline, f"never happened: {what or predicate}"
        await asyncio.sleep(0.02)


def until_sync(predicate: Callable[[], bool], timeout_s: float = HUNG_S, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"never happened: {what or predicate}"
        time.sleep(0.02)
