"""Policy measurements for `execgate bench`: a real OPA next to the embedded engine.

`local_opa` starts OPA (with the bundle server) over the shipped policy on
loopback ports for the length of the benchmark; the binary is the one the
Makefile builds ($EXECGATE_OPA_BIN, `make opa`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from gateway.policy.compiler import find_opa_binary
from gateway.policy.local_opa import REPO, LocalOpa

# Decisions per engine measurement: the floor, enough for a stable p99.
DECISIONS = 5000
POLICIES = REPO / "policies"


def sample_input() -> dict[str, Any]:
    """A policy input of the benchmark's own request: print(1) in python."""
    return {
        "version": "execgate.input/v1",
        "request": {
            "id": "req_bench",
            "time": "2026-01-01T00:00:00Z",
            "ingress": "rest",
            "tool_name": "run_code",
            "source_ip": "127.0.0.1",
        },
        "subject": {"sub": "bench", "tenant": "bench", "scopes": ["exec:python"], "claims": {}},
        "tenant": {
            "id": "bench",
            "languages": ["python"],
            "ceilings": {
                "timeout_s": 30,
                "memory_mb": 512,
                "cpus": 1,
                "pids": 64,
                "disk_mb": 64,
                "output_bytes": 1048576,
            },
            "usage": {"concurrent": 0, "cpu_s_last_hour": 0},
        },
        "execution": {
            "language": "python",
            "code": "print(1)",
            "code_sha256": "0" * 64,
            "code_bytes": len("print(1)"),
            "files": [],
            "limits": {},
            "egress": [],
            "backend": "nsjail",
        },
        "analysis": {"parsed": True, "imports": [], "calls": ["print"], "features": []},
        "approval": {"present": False},
    }


@asynccontextmanager
async def local_opa(log_dir: Path) -> AsyncIterator[LocalOpa]:
    opa = LocalOpa(find_opa_binary(), POLICIES, log_dir)
    await asyncio.to_thread(opa.start)
    try:
        yield opa
    finally:
        await asyncio.to_thread(opa.stop)


async def _engine_figures(decisions: int, log_dir: Path) -> dict[str, dict[str, float]]:
    """p50/p99 per decision, in microseconds, of each engine on the shipped policy."""
    from gateway.policy.base import PolicyEngine
    from gateway.policy.embedded import EmbeddedEngine
    from gateway.policy.opa import OpaEngine
    from gateway.policy.wasm import WasmEngine

    doc = sample_input()
    figures: dict[str, dict[str, float]] = {}

    async def measure(name: str, engine: PolicyEngine) -> None:
        await engine.start()
        try:
            for _ in range(50):
                await engine.decide(doc)
            samples = []
            for _ in range(decisions):
                t0 = time.perf_counter()
                await engine.decide(doc)
                samples.append(time.perf_counter() - t0)
        finally:
            await engine.close()
        samples.sort()
        figures[name] = {
            "n": decisions,
            "p50_us": round(samples[len(samples) // 2] * 1e6, 1),
            "p99_us": round(samples[min(len(samples) - 1, int(0.99 * len(samples)))] * 1e6, 1),
        }

    await measure("embedded (OPA Wasm)", WasmEngine(POLICIES, timeout_ms=10_000))
    await measure("rego-cpp", EmbeddedEngine(POLICIES, timeout_ms=10_000))
    async with local_opa(log_dir) as opa:
        await measure("OPA server (HTTP)", OpaEngine(opa.url, timeout_ms=10_000))
    return figures


def main() -> None:
    """`python -m gateway.bench.policy [decisions]`: the three engines side by side."""
    import json
    import sys
    import tempfile

    decisions = int(sys.argv[1]) if len(sys.argv) > 1 else DECISIONS
    with tempfile.TemporaryDirectory(prefix="execgate-policy-bench-") as tmp:
        figures = asyncio.run(_engine_figures(decisions, Path(tmp)))
    for name, row in figures.items():
        p50, p99 = row["p50_us"], row["p99_us"]
        print(f"{name:<22} n={row['n']:<6} p50 {p50:>8.1f} us  p99 {p99:>9.1f} us")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
