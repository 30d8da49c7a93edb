"""`execgate load` / `make load`: many requests from several tenants against one real
gateway (a subprocess on loopback, nsjail backend), then the figures and the checks.

Five tenants with different limits share the gateway; requests go round-robin at a
fixed concurrency. Reported per tenant: requests, 200s, 429s, achieved rate against
the configured one; overall p50/p99 latency and status counts. Checked: no 5xx, every
request audited exactly once (gateway/bench/load_checks.py), an intact hash chain, and no
sandbox directory, cgroup or process left behind once the gateway has stopped.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from gateway.audit.chain import verify_file
from gateway.auth.keys import load_or_create_dev_secret
from gateway.auth.tokens import mint_token
from gateway.bench.load_checks import (
    audit_counts,
    audit_problems,
    leaked_sandboxes,
    remove_cgroup_parents,
)
from gateway.bench.measure import percentiles
from gateway.bench.process import REPO, GatewayProcess

CODE = "print(sum(range(1000)))\n"
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class TenantPlan:
    name: str
    rate_per_s: float
    burst: int
    max_concurrent: int
    executions_per_day: int = 1_000_000


# One tenant per limit that should bind: rate, burst, concurrency, the global cap
# (flood: only fairness holds it back), executions per day.
TENANTS = (
    TenantPlan("steady", 5, 10, 32),
    TenantPlan("bursty", 1, 100, 32),
    TenantPlan("narrow", 10_000, 10_000, 2),
    TenantPlan("flood", 10_000, 10_000, 64),
    TenantPlan("daily", 10_000, 10_000, 32, executions_per_day=200),
)
GLOBAL_SLOTS = 24


def gateway_env(
    root: Path, cgroup_parent: str, queue_timeout_s: float, redis_url: str = ""
) -> dict[str, str]:
    env = {
        "EXECGATE_AUDIT_PATH": str(root / "audit.jsonl"),
        "EXECGATE_STATE_PATH": str(root / "state.db"),
        "EXECGATE_AUTH_HS256_SECRET_FILE": str(root / "hs256.key"),
        "EXECGATE_APPROVALS_SIGNING_KEY_FILE": str(root / "approval-ed25519.pem"),
        "EXECGATE_POLICY_PATH": str(REPO / "policies"),
        "EXECGATE_POLICY_RELOAD_INTERVAL_S": "0",
        "EXECGATE_POLICY_TIMEOUT_MS": "5000",
        "EXECGATE_BACKENDS_DEFAULT": "nsjail",
        "EXECGATE_BACKENDS_NSJAIL_STATE_DIR": str(root / "sandboxes"),
        "EXECGATE_BACKENDS_NSJAIL_CGROUP_PARENT": cgroup_parent,
        "EXECGATE_BACKENDS_NSJAIL_WARM_POOL_SIZE": "8",
        "EXECGATE_ADMISSION_MAX_CONCURRENT_EXECUTIONS": str(GLOBAL_SLOTS),
        "EXECGATE_ADMISSION_QUEUE_TIMEOUT_S": str(queue_timeout_s),
    }
    if redis_url:
        env["EXECGATE_STATE_BACKEND"] = "redis"
        env["EXECGATE_STATE_REDIS_URL"] = redis_url
    for t in TENANTS:
        prefix = f"EXECGATE_TENANTS_{t.name.upper()}_"
        env[prefix + "RATE_PER_S"] = str(t.rate_per_s)
        env[prefix + "BURST"] = str(t.burst)
        env[prefix + "MAX_CONCURRENT"] = str(t.max_concurrent)
        env[prefix + "EXECUTIONS_PER_DAY"] = str(t.executions_per_day)
    return env


async def _drive(
    url: str, tokens: dict[str, str], requests: int, concurrency: int
) -> list[tuple[str, int, str, float]]:
    """(tenant, status, error code, seconds) per request."""
    results: list[tuple[str, int, str, float]] = []
    next_index = iter(range(requests))
    connector = aiohttp.TCPConnector(limit=concurrency)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def worker() -> None:
            for i in next_index:
                tenant = TENANTS[i % len(TENANTS)].name
                headers = {"Authorization": f"Bearer {tokens[tenant]}"}
                started = time.perf_counter()
                body = {"language": "python", "code": CODE}
                async with session.post(url, json=body, headers=headers) as resp:
                    answer = await resp.json()
                    error = answer.get("error", {})
                    code = "" if resp.status == 200 else error.get("limit") or error["code"]
                    seconds = time.perf_counter() - started
                    results.append((tenant, resp.status, code, seconds))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return results


def _workdir() -> str:
    path = tempfile.mkdtemp(prefix="execgate-load-", dir="/tmp")
    os.chmod(path, 0o755)  # the sandbox uid traverses to its bind-mount sources
    return path


async def run_load(
    requests: int, concurrency: int, max_seconds: float, redis_url: str = ""
) -> dict[str, Any]:
    root = Path(await asyncio.to_thread(_workdir))
    cgroup_parent = f"/execgate-load-{root.name.rsplit('-', 1)[-1]}"
    env = gateway_env(root, cgroup_parent, min(120.0, max_seconds), redis_url)
    secret = await asyncio.to_thread(load_or_create_dev_secret, root / "hs256.key")
    tokens = {
        t.name: mint_token(secret, tenant=t.name, sub="load", scopes=["exec:python"], ttl_s=7200)
        for t in TENANTS
    }
    gateway = GatewayProcess(env, root / "gateway.log")
    await asyncio.to_thread(gateway.start)
    try:
        started = time.perf_counter()
        results = await asyncio.wait_for(
            _drive(f"{gateway.url}/v1/executions", tokens, requests, concurrency), max_seconds
        )
        elapsed = time.perf_counter() - started
    finally:
        await asyncio.to_thread(gateway.stop)
    report = _report(results, elapsed, requests, concurrency)
    report["state"] = "redis" if redis_url else "in-process"
    counts = await asyncio.to_thread(audit_counts, root / "audit.jsonl")
    sent = Counter(tenant for tenant, *_ in results)
    ok = Counter(tenant for tenant, status, *_ in results if status == 200)
    problems = audit_problems(counts, sent, ok)
    chain = await asyncio.to_thread(verify_file, root / "audit.jsonl")
    if not chain.ok:
        problems.append(f"audit chain: {chain.describe()}")
    leaks = await asyncio.to_thread(
        leaked_sandboxes, root / "sandboxes", CGROUP_ROOT, cgroup_parent
    )
    problems += leaks
    if report["status_5xx"]:
        problems.append(f"{report['status_5xx']} answers were 5xx")
    if len(results) != requests:
        problems.append(f"{requests - len(results)} requests got no answer")
    report["audit_records_checked"] = sum(sum(c.values()) for c in counts.values())
    report["problems"] = problems
    if not problems:
        await asyncio.to_thread(remove_cgroup_parents, CGROUP_ROOT, cgroup_parent)
        await asyncio.to_thread(shutil.rmtree, root, True)
    else:
        report["kept"] = str(root)
    return report


def _report(
    results: list[tuple[str, int, str, float]], elapsed: float, requests: int, concurrency: int
) -> dict[str, Any]:
    tenants = []
    for plan in TENANTS:
        mine = [r for r in results if r[0] == plan.name]
        ok = sum(1 for r in mine if r[1] == 200)
        allowed = min(plan.burst + plan.rate_per_s * elapsed, plan.executions_per_day)
        tenants.append(
            {
                "tenant": plan.name,
                "limit": f"{plan.rate_per_s:g}/s burst {plan.burst}, "
                f"{plan.max_concurrent} concurrent, {plan.executions_per_day}/day",
                "requests": len(mine),
                "ok": ok,
                "limited": dict(Counter(r[2] for r in mine if r[1] != 200)),
                "achieved_per_s": round(ok / elapsed, 2),
                "within_limit": ok <= allowed + 1,
            }
        )
    latency = percentiles([r[3] for r in results])
    ok_latency = percentiles([r[3] for r in results if r[1] == 200] or [0.0])
    limited_latency = percentiles([r[3] for r in results if r[1] == 429] or [0.0])
    return {
        "requests": requests,
        "concurrency": concurrency,
        "elapsed_s": round(elapsed, 2),
        "requests_per_s": round(len(results) / elapsed, 1),
        "global_slots": GLOBAL_SLOTS,
        "statuses": dict(sorted(Counter(str(r[1]) for r in results).items())),
        "status_429": sum(1 for r in results if r[1] == 429),
        "status_5xx": sum(1 for r in results if r[1] >= 500),
        "latency_ms": {k: round(v, 2) for k, v in latency.items()},
        "latency_ms_200": {k: round(v, 2) for k, v in ok_latency.items()},
        "latency_ms_429": {k: round(v, 2) for k, v in limited_latency.items()},
        "tenants": tenants,
    }


def render(report: dict[str, Any]) -> str:
    lines = [
        f"{report['requests']} requests at concurrency {report['concurrency']} in "
        f"{report['elapsed_s']} s ({report['requests_per_s']}/s); state {report['state']}; "
        f"global slots "
        f"{report['global_slots']}; statuses {report['statuses']}; latency ms "
        f"{report['latency_ms']} (200: {report['latency_ms_200']}, "
        f"429: {report['latency_ms_429']})",
        "",
        "| tenant | limit | requests | 200 | refused, by limit | achieved /s | within limit |",
        "|---|---|---|---|---|---|---|",
    ]
    for t in report["tenants"]:
        lines.append(
            f"| {t['tenant']} | {t['limit']} | {t['requests']} | {t['ok']} | "
            f"{t['limited']} | {t['achieved_per_s']} | {'yes' if t['within_limit'] else 'NO'} |"
        )
    lines.append("")
    lines.append(f"audit records checked: {report['audit_records_checked']}")
    problems = report["problems"]
    lines.append("problems: " + ("; ".join(problems) if problems else "none"))
    return "\n".join(lines)


def main(
    requests: int, concurrency: int, max_seconds: float, json_path: str | None, redis_url: str
) -> int:
    report = asyncio.run(run_load(requests, concurrency, max_seconds, redis_url))
    print(render(report))
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2) + "\n")
    return 1 if report["problems"] else 0
