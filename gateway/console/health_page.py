"""The health page: readiness of each part, sandbox pools, the last escape self-test
per backend, and admission refusals per tenant (tables that console.js also draws)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from aiohttp import web
from prometheus_client import Counter

from gateway.appkeys import SERVICES
from gateway.audit.read import query
from gateway.console import html
from gateway.console.guard import require
from gateway.console.session import Session
from gateway.escape.technique import Outcome
from gateway.services import Services

routes = web.RouteTableDef()

READ = ("audit:read", "audit:read:all")
_POOL = re.compile(r"(\d+) running, (\d+) ready")
_OUTCOMES = tuple(o.value for o in Outcome)


async def _readiness(svc: Services) -> list[tuple[str, bool, str]]:
    policy_ok, policy_detail = await svc.engine.health()
    checks = [("policy", policy_ok, str(policy_detail))]
    names = list(svc.backends)
    healths = await asyncio.gather(*(svc.backends[n].health() for n in names))
    for name, health in zip(names, healths, strict=True):
        held = svc.out_of_service.get(name)
        if held:
            checks.append((f"backend {name}", False, f"out of service: {held}"))
        else:
            checks.append((f"backend {name}", health.ok, health.detail))
    detail = "writable" if svc.audit.healthy else "audit log not writable"
    checks.append(("audit log", svc.audit.healthy, detail))
    return checks


def _pools(svc: Services, checks: list[tuple[str, bool, str]]) -> list[list[str]]:
    details = {name: detail for name, _, detail in checks}
    rows = []
    for name, backend in svc.backends.items():
        extra = backend.capabilities.extra
        size = extra.get("warm_pool_size", extra.get("pool_size"))
        match = _POOL.search(details.get(f"backend {name}", ""))
        running, ready = match.groups() if match else ("—", "—")
        rows.append([html.esc(name), html.value(size), html.esc(running), html.esc(ready)])
    return rows


def _counter(counter: Counter, name: str) -> list[dict[str, Any]]:
    """(labels + value) of one counter: only it is read, not the whole registry."""
    out = []
    for metric in counter.collect():
        for sample in metric.samples:
            if sample.name == name:
                out.append({**sample.labels, "value": sample.value})
    return out


def _rate_limited(svc: Services, session: Session) -> list[list[str]]:
    per_tenant: dict[str, float] = {}
    for sample in _counter(svc.metrics.limited, "execgate_rate_limited_total"):
        tenant = sample["tenant"]
        if session.has("audit:read:all") or tenant == session.tenant:
            per_tenant[tenant] = per_tenant.get(tenant, 0) + sample["value"]
    return [[html.esc(t), html.esc(int(v))] for t, v in sorted(per_tenant.items())]


def _executions(svc: Services) -> list[list[str]]:
    samples = _counter(svc.metrics.executions, "execgate_executions_total")
    return [
        [html.esc(f"{s['backend']} {s['status']}"), html.esc(int(s["value"]))]
        for s in sorted(samples, key=lambda s: (s["backend"], s["status"]))
    ]


async def _selftests(svc: Services) -> list[list[str]]:
    records = await query(svc.settings.audit.path, type="sandbox.selftest", limit=50, newest=True)
    last: dict[str, dict[str, Any]] = {}
    for record in records:
        last[str(record.get("backend"))] = record
    rows = []
    for name, record in sorted(last.items()):
        counts = record.get("counts") or {}
        state = "out_of_service" if record.get("out_of_service") else "sound"
        rows.append(
            [html.esc(name), html.esc(record.get("ts"))]
            + [html.esc(counts.get(o, 0)) for o in _OUTCOMES]
            + [
                html.value(record.get("escaped")),
                html.esc(record.get("duration_ms")),
                html.badge(state),
            ]
        )
    return rows


@routes.get("/health")
async def health_page(request: web.Request) -> web.Response:
    session = require(request, *READ)
    svc = request.config_dict[SERVICES]
    checks = await _readiness(svc)
    ready = all(ok for _, ok, _ in checks)
    state = html.badge("ready" if ready else "not_ready")
    body = f'<p class="overall">Gateway: {state}</p>'
    body += html.table(
        ["part", "state", "detail"],
        [[html.esc(n), html.badge("ok" if ok else "failing"), html.esc(d)] for n, ok, d in checks],
        "readiness",
    )
    body += '<h2 class="section">Behaviour capture</h2>'
    body += html.table(
        ["backend", "capture", "why not"],
        [
            [html.esc(name), html.badge("on" if on else "off"), html.esc(why or "—")]
            for name, (on, why) in ((n, b.capture_status()) for n, b in svc.backends.items())
        ],
        "capture",
    )
    body += '<div class="grid">'
    body += html.chart(
        "Sandbox pools",
        ["backend", "pool size", "running", "ready"],
        _pools(svc, checks),
        "no backends",
    )
    body += html.chart(
        "Admission refusals per tenant",
        ["tenant", "refused"],
        _rate_limited(svc, session),
        "No request refused for rate or quota since start.",
    )
    body += html.chart(
        "Executions by backend and status",
        ["backend status", "executions"],
        _executions(svc),
        "No executions since start.",
    )
    body += "</div>"
    body += '<h2 class="section">Last escape self-test</h2>'
    selftests = await _selftests(svc)
    headers = ["backend", "when", *_OUTCOMES, "escaped", "ms", "state"]
    body += (
        html.table(headers, selftests, "selftest")
        if selftests
        else '<p class="muted">No self-test has run yet (escape_test.interval_s, or POST '
        "/v1/admin/escape-test).</p>"
    )
    return html.page("Health", body, session, active="/console/health")
