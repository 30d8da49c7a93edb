"""The docker backends in `execgate bench`: `docker run --rm` against the backend.

For each runtime (runc: `docker`, runsc: `docker-gvisor`), side by side: the
engine's own CLI running the same program in a fresh container (`docker run --rm`,
no network, the same image), the backend with no pool (every execution creates,
starts and removes its container), and the backend served from its pool of
containers started ahead. Latency is measured one execution at a time (for the
pool: with a container waiting, which is what the pool is for); throughput at
concurrency 1 and 4 without waiting, after a warm-up at the same concurrency (the
pool sizes itself from recent demand) and with the pool settled, replacements
starting while it runs: sustained, that is bounded by how fast the engine starts
containers, as `docker run --rm` is. The burst row is a pool configured to hold
the whole burst (`pool_size` = `pool_max_size` = BURST): what the pool buys a burst
it was sized for.
How many executions came from the pool, from a start already under way, or
from a start of their own is reported with it.

A start the engine refuses before the program ran (runsc: `cannot start a
stopped process`, docs/ARCHITECTURE.md) is retried by the backend
(backends/attempts.py); `docker run --rm` is retried the same way here (exit
status 125: the engine's own failure) and its refusals counted, so one refusal
never costs a runtime its figures.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import Any

from backends.base import BackendError, ExecSpec, Limits
from backends.docker.backend import DockerBackend
from backends.docker.gvisor import GvisorBackend
from backends.docker.settings import DockerSettings, GvisorSettings
from gateway.bench.measure import alternated_throughput, percentiles, throughput, timed
from gateway.context import new_id

CODE = "print(1)"
POOL_SIZE = 4  # the floor; the pool grows from demand up to POOL_MAX_SIZE
POOL_MAX_SIZE = 16
BURST = 16  # executions of the burst row, and the pool configured to hold them
CLI_ATTEMPTS = 3
ENGINE_FAILED = 125  # `docker run`'s exit status when the engine failed, not the program
FULL_TIMEOUT_S = 120.0
# (f) sustained, in alternating blocks: executions per side in all.
ALTERNATED_TOTAL = 48


async def docker_bench(runs: int) -> dict[str, Any]:
    """{"runc": {...}, "runsc": {...}}; a runtime that cannot run says why instead."""
    if shutil.which("docker") is None:
        return {"skipped": "no docker CLI on PATH"}
    n = max(10, runs // 2)
    results: dict[str, Any] = {}
    for runtime, cls, settings in (
        ("runc", DockerBackend, DockerSettings),
        ("runsc", GvisorBackend, GvisorSettings),
    ):
        try:
            results[runtime] = await _one_runtime(runtime, cls, settings, n)
        except BackendError as exc:
            results[runtime] = {"skipped": str(exc)}
    return results


async def _one_runtime(
    runtime: str,
    cls: type[DockerBackend],
    settings_cls: type[DockerSettings],
    n: int,
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cold = cls(settings_cls(pool_size=0))
    await cold.start()
    try:
        image = cold.image
        refused: list[str] = []

        async def cli() -> None:
            for _ in range(CLI_ATTEMPTS):
                proc = await asyncio.create_subprocess_exec(
                    "docker", "run", "--rm", "--network", "none", "--runtime", runtime, image,
                    "/usr/bin/python3", "-I", "-c", CODE,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                )  # fmt: skip
                stdout, stderr = await proc.communicate()
                if stdout == b"1\n":
                    return
                if proc.returncode != ENGINE_FAILED:
                    break
                refused.append(stderr.decode(errors="replace").strip()[-300:])
            raise BackendError(f"docker run printed {stdout!r}: {stderr[-300:]!r}")

        out["cli_run_rm"] = percentiles(await timed(cli, n))
        out["cli_run_rm_throughput"] = [await throughput(cli, c, max(n, 4 * c)) for c in (1, 4)]
        out["backend_cold"] = percentiles(await timed(_execute(cold), n))
        out["backend_cold_throughput"] = [
            await throughput(_execute(cold), c, max(n, 4 * c)) for c in (1, 4)
        ]
    finally:
        await cold.close()

    pooled = cls(settings_cls(pool_size=POOL_SIZE, pool_max_size=POOL_MAX_SIZE))
    await pooled.start()
    try:
        run = _execute(pooled)
        samples = []
        for _ in range(n + 3):
            await pooled.wait_settled()  # a container is waiting, as the pool intends
            t0 = time.perf_counter()
            await run()
            samples.append(time.perf_counter() - t0)
        out["backend_pooled"] = percentiles(samples[3:])
        out["pool_hits"] = pooled.pool.hits
        out["backend_pooled_throughput"] = []
        for c in (1, 4):
            await throughput(run, c, 2 * c)  # the pool follows this demand
            out["backend_pooled_throughput"].append(await _served(pooled, c, max(n, 4 * c)))
        # (f), sustained: `docker run --rm` and the pool at concurrency 4 in alternating
        # blocks, each of the pool's ending once it is as full as it began.
        cli_rm, from_pool = await alternated_throughput(
            (cli, run), 4, ALTERNATED_TOTAL, after=(None, lambda: _full(pooled))
        )
        out["beside_cli_c4"] = {"cli_run_rm": cli_rm, "backend_pooled": from_pool}
        out["cli_refused"] = len(refused)
        if refused:
            out["cli_refused_last"] = refused[-1]
        failures = pooled.start_failures.total + cold.start_failures.total
    finally:
        await pooled.close()
    # A burst the pool was configured for (floor = ceiling = the burst): what the
    # pool buys when starts are not the bound.
    burst = cls(settings_cls(pool_size=BURST, pool_max_size=BURST))
    await burst.start()
    try:
        await _full(burst)
        out["backend_burst_throughput"] = [await _served(burst, 4, BURST)]
        out["start_failures"] = failures + burst.start_failures.total
    finally:
        await burst.close()
    out["pooled_vs_cli_p50"] = round(
        out["cli_run_rm"]["p50_ms"] / out["backend_pooled"]["p50_ms"], 1
    )
    return out


async def _full(backend: DockerBackend, timeout_s: float = FULL_TIMEOUT_S) -> None:
    """Wait until the pool holds all it was configured for: a start the engine
    refused is retried after a back-off, when no task is under way, so a settled
    pool may still be short (session 19's runsc burst began with 14 of 16)."""
    pool = backend.pool
    deadline = time.monotonic() + timeout_s
    while len(pool.ready) < pool.target() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        await backend.wait_settled()


async def _served(backend: DockerBackend, concurrency: int, total: int) -> dict[str, Any]:
    """Throughput from a settled pool, and how the pool served it."""
    await backend.wait_settled()
    pool = backend.pool
    before = (pool.hits, pool.claims, pool.misses, len(pool.ready))
    row = await throughput(_execute(backend), concurrency, total)
    row["from_pool"] = pool.hits - before[0]
    row["from_a_start_under_way"] = pool.claims - before[1]
    row["own_start"] = pool.misses - before[2]
    row["pool_ready_at_start"] = before[3]
    return row


def _execute(backend: DockerBackend) -> Callable[[], Awaitable[None]]:
    async def execute() -> None:
        result = await backend.run(ExecSpec(new_id("exe"), "python", CODE, Limits()))
        if result.stdout != b"1\n":
            raise BackendError(f"unexpected sandbox result: {result}")

    return execute


def render_docker(results: dict[str, Any]) -> list[str]:
    lines = ["", f"{'docker backends':<28}  {'n':>5}  {'p50 ms':>9}  {'p99 ms':>9}"]
    if "skipped" in results:
        return [*lines, f"  skipped: {results['skipped']}"]
    throughput = [f"{'docker throughput':<28}  {'conc':>5}  {'exec/s':>9}  {'p50 ms':>9}  "
                  f"{'p99 ms':>9}"]  # fmt: skip
    for runtime, r in results.items():
        if "skipped" in r:
            lines.append(f"  {runtime}: skipped: {r['skipped'][:200]}")
            continue
        for key in ("cli_run_rm", "backend_cold", "backend_pooled", "backend_burst"):
            if (p := r.get(key)) is not None:
                lines.append(f"{runtime + ' ' + key:<28}  {p['n']:>5}  {p['p50_ms']:>9.2f}  "
                             f"{p['p99_ms']:>9.2f}")  # fmt: skip
            for t in r.get(key + "_throughput", ()):
                served = ""
                if "from_pool" in t:
                    served = (f"  ({t['pool_ready_at_start']} ready: {t['from_pool']} from the "
                              f"pool, {t['from_a_start_under_way']} from a start under way, "
                              f"{t['own_start']} own start)")  # fmt: skip
                throughput.append(
                    f"{runtime + ' ' + key:<28}  {t['concurrency']:>5}  {t['per_s']:>9}  "
                    f"{t['p50_ms']:>9.2f}  {t['p99_ms']:>9.2f}{served}"
                )
        for side, t in (r.get("beside_cli_c4") or {}).items():
            throughput.append(
                f"{runtime + ' ' + side + ', blocks':<28}  {t['concurrency']:>5}  {t['per_s']:>9}  "
                f"{t['p50_ms']:>9.2f}  {t['p99_ms']:>9.2f}  (rounds: "
                + ", ".join(f"{x:g}" for x in t["rounds"])
                + ")"
            )
        lines.append(
            f"{runtime}: pooled vs `docker run --rm` (p50): {r['pooled_vs_cli_p50']}x faster "
            "(target >= 3x)"
        )
    return [*lines, "", *throughput]
