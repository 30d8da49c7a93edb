"""Patterns over time: what sandboxed code tried, by tenant and kind, per hour or per
day, and the places it tried most (blocked paths, programs, refused system calls,
blocked destinations, review flags), drawn from the audit log.

The page reads the newest `MAX_RECORDS` records of the three types it counts
(`execution.behaviour`, `network.attempt`, `execution.review`) off the event loop
and aggregates them in one pass; each table is one console.js bar chart.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web

from gateway.appkeys import SERVICES
from gateway.audit.read import query
from gateway.console import html
from gateway.console.guard import require
from gateway.errors import invalid_field

routes = web.RouteTableDef()

READ = ("audit:read", "audit:read:all")
MAX_RECORDS = 20_000
TOP = 10
# bucket -> (strftime of a bucket's key, buckets shown)
BUCKETS = {"hour": ("%Y-%m-%d %H:00", 48), "day": ("%Y-%m-%d", 14)}
KINDS = ("files", "programs", "signals", "syscalls", "network", "flags")


@dataclass
class Patterns:
    over_time: dict[str, collections.Counter[str]] = field(default_factory=dict)
    by_tenant: dict[str, collections.Counter[str]] = field(default_factory=dict)
    paths: collections.Counter[str] = field(default_factory=collections.Counter)
    programs: collections.Counter[str] = field(default_factory=collections.Counter)
    syscalls: collections.Counter[str] = field(default_factory=collections.Counter)
    destinations: collections.Counter[str] = field(default_factory=collections.Counter)
    rules: collections.Counter[str] = field(default_factory=collections.Counter)


def _count(entries: Any) -> int:
    if not isinstance(entries, list):
        return 0
    return sum(int(e.get("count", 1)) for e in entries if isinstance(e, dict))


def aggregate(records: list[dict[str, Any]], bucket: str, now: datetime) -> Patterns:
    """Counts per time bucket and kind, per tenant and kind, and the top places."""
    fmt, shown = BUCKETS[bucket]
    step = timedelta(hours=1) if bucket == "hour" else timedelta(days=1)
    keys = [(now - step * i).strftime(fmt) for i in range(shown - 1, -1, -1)]
    out = Patterns(over_time={k: collections.Counter() for k in keys})
    for record in records:
        try:
            when = datetime.fromisoformat(str(record.get("ts")).replace("Z", "+00:00"))
        except ValueError:
            continue
        key = when.astimezone(UTC).strftime(fmt)
        counts: collections.Counter[str] = collections.Counter()
        kind = record.get("type")
        if kind == "execution.behaviour":
            files = [f for f in record.get("files") or [] if isinstance(f, dict)]
            counts["files"] += _count(files)
            counts["programs"] += _count(record.get("programs"))
            counts["signals"] += _count(record.get("signals"))
            refused = record.get("syscalls_refused") or {}
            if isinstance(refused, dict):
                for name, n in refused.items():
                    counts["syscalls"] += int(n)
                    out.syscalls[str(name)] += int(n)
            for f in files:
                if f.get("result") != "ok":
                    out.paths[str(f.get("path"))] += int(f.get("count", 1))
            for p in record.get("programs") or []:
                if isinstance(p, dict):
                    out.programs[str(p.get("path"))] += int(p.get("count", 1))
        elif kind == "network.attempt":
            if record.get("verdict") == "blocked":
                counts["network"] += 1
                out.destinations[f"{record.get('host')}:{record.get('port')}"] += 1
        elif kind == "execution.review":
            for flag in record.get("flags") or []:
                if isinstance(flag, dict):
                    counts["flags"] += 1
                    out.rules[f"{flag.get('rule')} ({flag.get('severity')})"] += 1
        if not counts:
            continue
        if key in out.over_time:
            out.over_time[key].update(counts)
        tenant = str(record.get("tenant"))
        out.by_tenant.setdefault(tenant, collections.Counter()).update(counts)
    return out


def _top(counter: collections.Counter[str]) -> list[list[str]]:
    return [[html.esc(name), html.esc(n)] for name, n in counter.most_common(TOP)]


@routes.get("/patterns")
async def patterns_page(request: web.Request) -> web.Response:
    session = require(request, *READ)
    svc = request.config_dict[SERVICES]
    bucket = request.query.get("per", "hour")
    if bucket not in BUCKETS:
        raise invalid_field("per", "must be hour or day")
    tenant = request.query.get("tenant") if session.has("audit:read:all") else session.tenant
    found = await asyncio.gather(*(
        query(svc.settings.audit.path, type=t, tenant=tenant, limit=MAX_RECORDS, newest=True)
        for t in ("execution.behaviour", "network.attempt", "execution.review")
    ))  # fmt: skip
    records = [r for group in found for r in group]
    patterns = await asyncio.to_thread(aggregate, records, bucket, datetime.now(UTC))
    other = "day" if bucket == "hour" else "hour"
    body = (
        f"<p>Attempts per {html.esc(bucket)}"
        f"{' for tenant ' + html.esc(tenant) if tenant else ', all tenants'} · "
        f'<a href="{html.url("/console/patterns", per=other, tenant=tenant or "")}">'
        f"per {html.esc(other)}</a></p>"
    )
    rows = [
        [html.esc(key)] + [html.esc(c[k]) for k in KINDS] + [html.esc(sum(c.values()))]
        for key, c in patterns.over_time.items()
    ]
    body += html.chart(f"Attempts per {bucket}", ["when", *KINDS, "total"], rows, "none")
    tenants = [
        [html.esc(t)] + [html.esc(c[k]) for k in KINDS] + [html.esc(sum(c.values()))]
        for t, c in sorted(patterns.by_tenant.items())
    ]
    body += html.chart("By tenant", ["tenant", *KINDS, "total"], tenants, "Nothing tried yet.")
    body += '<div class="grid">'
    body += html.chart("Top blocked paths", ["path", "times"], _top(patterns.paths), "none")
    body += html.chart("Top programs", ["program", "times"], _top(patterns.programs), "none")
    body += html.chart(
        "Top refused system calls", ["system call", "times"], _top(patterns.syscalls), "none"
    )
    body += html.chart(
        "Top blocked destinations", ["destination", "times"], _top(patterns.destinations), "none"
    )
    body += html.chart("Review flags", ["rule", "times"], _top(patterns.rules), "none")
    body += "</div>"
    return html.page("Patterns", body, session, active="/console/patterns")
