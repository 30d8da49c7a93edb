"""How the benchmarks measure: samples after a warm-up, percentiles, and throughput at
a given concurrency. Shared by every benchmark of `execgate bench`."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any


def percentiles(samples_s: list[float]) -> dict[str, float]:
    ordered = sorted(samples_s)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return {
        "n": len(ordered),
        "p50_ms": round(statistics.median(ordered) * 1000, 3),
        "p95_ms": round(pick(0.95), 3),
        "p99_ms": round(pick(0.99), 3),
    }


async def timed(
    fn: Callable[[], Awaitable[Any]],
    runs: int,
    warmup: int = 3,
    before: Callable[[], Awaitable[Any]] | None = None,
) -> list[float]:
    """`runs` timings of `fn`, after `warmup` untimed calls; `before` (untimed) ahead
    of each call, e.g. waiting until a backend's pool has settled."""
    samples = []
    for i in range(warmup + runs):
        if before is not None:
            await before()
        t0 = time.perf_counter()
        await fn()
        if i >= warmup:
            samples.append(time.perf_counter() - t0)
    return samples


async def paired(
    fns: tuple[Callable[[], Awaitable[Any]], Callable[[], Awaitable[Any]]],
    runs: int,
    warmup: int = 3,
    before: tuple[Callable[[], Awaitable[Any]] | None, ...] = (None, None),
) -> tuple[list[float], list[float]]:
    """`runs` timings of each of two functions taken in turns (A then B, then B then
    A, ...), so that both sides share every moment of the run: two blocks taken one
    after the other compare two moments as much as two settings, on a machine whose
    speed drifts (this VM's, by a third within minutes). `before[i]` (untimed) goes
    ahead of each call of `fns[i]`."""
    samples: tuple[list[float], list[float]] = ([], [])
    for i in range(warmup + runs):
        for k in (0, 1) if i % 2 == 0 else (1, 0):
            prepare = before[k]
            if prepare is not None:
                await prepare()
            t0 = time.perf_counter()
            await fns[k]()
            if i >= warmup:
                samples[k].append(time.perf_counter() - t0)
    return samples


async def throughput(
    fn: Callable[[], Awaitable[Any]], concurrency: int, total: int
) -> dict[str, Any]:
    latencies: list[float] = []
    queue = iter(range(total))

    async def worker() -> None:
        for _ in queue:
            t0 = time.perf_counter()
            await fn()
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    return {
        "concurrency": concurrency,
        "per_s": round(total / elapsed, 1),
        **percentiles(latencies),
    }
