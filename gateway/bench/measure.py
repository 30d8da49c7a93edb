"""How the benchmarks measure: samples after a warm-up, percentiles, and throughput at
a given concurrency. Shared by every benchmark of `execgate bench`."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

ALTERNATED_ROUNDS = 3  # blocks per side of alternated_throughput, after its warm-up


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


async def _block(
    fn: Callable[[], Awaitable[Any]], concurrency: int, total: int, latencies: list[float]
) -> float:
    """`total` calls of `fn`, `concurrency` at a time; their latencies appended, the
    block's elapsed seconds returned."""
    queue = iter(range(total))

    async def worker() -> None:
        for _ in queue:
            t0 = time.perf_counter()
            await fn()
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - t0


async def throughput(
    fn: Callable[[], Awaitable[Any]], concurrency: int, total: int
) -> dict[str, Any]:
    latencies: list[float] = []
    elapsed = await _block(fn, concurrency, total, latencies)
    return {
        "concurrency": concurrency,
        "per_s": round(total / elapsed, 1),
        **percentiles(latencies),
    }


async def alternated_throughput(
    fns: tuple[Callable[[], Awaitable[Any]], Callable[[], Awaitable[Any]]],
    concurrency: int,
    total: int,
    rounds: int = ALTERNATED_ROUNDS,
    after: tuple[Callable[[], Awaitable[Any]] | None, ...] = (None, None),
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The throughput of two workloads in alternating blocks (A B, then B A, ...):
    `rounds` blocks each, `total` executions per side in all, `concurrency` at a
    time, after one untimed block each as a warm-up. Two rows taken minutes apart
    compare two moments of a VM whose speed drifts by a third as much as two ways of
    running; here both sides share every stretch of the run. `after[i]` (e.g. waiting
    until a backend's pool is as full as when the block began) ends each block of
    `fns[i]` and counts in its time: work a block leaves behind is that side's, not
    the next block's. Each side: executions per second over all its blocks, each
    block's rate, and its latencies' percentiles."""
    per_block = max(concurrency, total // rounds)
    latencies: tuple[list[float], list[float]] = ([], [])
    elapsed = [0.0, 0.0]
    rates: tuple[list[float], list[float]] = ([], [])
    for i in range(rounds + 1):
        for k in (0, 1) if i % 2 == 0 else (1, 0):
            sink: list[float] = latencies[k] if i else []
            t0 = time.perf_counter()
            await _block(fns[k], concurrency, per_block, sink)
            settle = after[k]
            if settle is not None:
                await settle()
            took = time.perf_counter() - t0
            if i:  # the first round warms both sides up
                elapsed[k] += took
                rates[k].append(round(per_block / took, 1))
    first, second = (
        {
            "concurrency": concurrency,
            "per_s": round(per_block * rounds / elapsed[k], 1),
            "rounds": rates[k],
            **percentiles(latencies[k]),
        }
        for k in (0, 1)
    )
    return first, second
