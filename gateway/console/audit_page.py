"""The audit trail: filtered records and the hash chain's verification status.

Records are shown by type but rendered generically (every field, nested values as
JSON), so record types added later (network attempts, sandbox events...) appear
without a console change. One execution's story: story_page.py.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from gateway import errors
from gateway.appkeys import SERVICES
from gateway.audit.read import query
from gateway.console import html
from gateway.console.chain import CHAIN
from gateway.console.guard import require
from gateway.console.session import Session
from gateway.errors import GatewayError

routes = web.RouteTableDef()

READ = ("audit:read", "audit:read:all")
PAGE_RECORDS = 200
# Shown in a record's heading line, not again in its field table.
HEAD = ("seq", "ts", "type", "hash", "prev_hash", "tenant", "execution_id")
FILTERS = ("tenant", "type", "execution_id", "since", "until")


def _tenant_scope(session: Session, wanted: str | None) -> str | None:
    if session.has("audit:read:all"):
        return wanted or None
    if wanted and wanted != session.tenant:
        raise GatewayError(errors.FORBIDDEN, "audit:read covers only your own tenant")
    return session.tenant


def _exec_link(execution_id: object) -> str:
    if not isinstance(execution_id, str) or not execution_id:
        return '<span class="muted">—</span>'
    href = html.esc(f"/console/executions/{execution_id}")
    return f'<a href="{href}">{html.esc(execution_id)}</a>'


def _summary(record: dict[str, Any]) -> str:
    rest = {k: v for k, v in record.items() if k not in (*HEAD, "subject", "request_id")}
    text = json.dumps(rest, sort_keys=True, ensure_ascii=False)
    return html.esc(text if len(text) <= 240 else text[:239] + "…")


def type_label(record_type: object) -> str:
    kind = record_kind(str(record_type))
    return f'<span class="type t-{kind}">{html.esc(record_type)}</span>'


def record_kind(record_type: str) -> str:
    head = record_type.split(".", 1)[0]
    return "".join(c for c in head if c.isalnum()) or "other"


async def chain_box(request: web.Request) -> str:
    path = request.config_dict[SERVICES].settings.audit.path
    report, current = await request.app[CHAIN].check(path)
    if report is None and not current:
        return '<p class="chain">Hash chain: verifying the log…</p>'
    if report is None:
        return '<p class="chain">Audit log: no records yet.</p>'
    state = "chain-ok" if report.ok else "chain-broken"
    note = "" if current else " (verifying what was appended since…)"
    return f'<p class="chain {state}">Hash chain: {html.esc(report.describe() + note)}</p>'


def _filters(session: Session, q: dict[str, str]) -> str:
    def field(name: str, label: str, kind: str = "text") -> str:
        return (
            f'<label>{html.esc(label)}<input type="{kind}" name="{name}" '
            f'value="{html.esc(q.get(name, ""))}"></label>'
        )

    tenant = field("tenant", "tenant") if session.has("audit:read:all") else ""
    return (
        '<form method="get" action="/console/audit" class="filters">'
        + tenant
        + field("type", "type")
        + field("execution_id", "execution id")
        + field("since", "since (UTC)", "datetime-local")
        + field("until", "until (UTC)", "datetime-local")
        + '<button type="submit">Filter</button></form>'
    )


def _cursor(q: dict[str, str]) -> int:
    raw = q.get("before", "")
    if not raw:
        return 0
    if not raw.isdigit() or len(raw) > 18:
        raise GatewayError(errors.INVALID_REQUEST, "before: not a record seq")
    return int(raw)


def _older_link(q: dict[str, str], records: list[dict[str, Any]]) -> str:
    # A full page may have more behind it; the cursor is the last shown record's seq.
    if len(records) < PAGE_RECORDS or not isinstance(records[-1].get("seq"), int):
        return ""
    params = {k: v for k, v in q.items() if k in FILTERS and v}
    params["before"] = str(records[-1]["seq"])
    href = html.esc("/console/audit?" + urlencode(params))
    return f'<p class="pager"><a href="{href}" rel="next">Older records →</a></p>'


@routes.get("/audit")
async def audit_page(request: web.Request) -> web.Response:
    session = require(request, *READ)
    q = {k: v.strip() for k, v in request.query.items() if isinstance(v, str)}
    tenant = _tenant_scope(session, q.get("tenant"))
    before = _cursor(q)
    try:
        records = await query(
            request.config_dict[SERVICES].settings.audit.path,
            tenant=tenant,
            type=q.get("type") or None,
            since=q.get("since") or None,
            until=q.get("until") or None,
            execution_id=q.get("execution_id") or None,
            before_seq=before,
            limit=PAGE_RECORDS,
            descending=True,
        )
    except ValueError as exc:
        raise GatewayError(errors.INVALID_REQUEST, str(exc)) from None
    rows = [
        [
            html.esc(r.get("seq")),
            html.esc(r.get("ts")),
            type_label(r.get("type")),
            html.value(r.get("tenant")),
            _exec_link(r.get("execution_id")),
            html.value(r.get("subject")),
            f'<span class="summary">{_summary(r)}</span>',
        ]
        for r in records
    ]
    body = await chain_box(request) + _filters(session, q)
    where = f"Older than seq {before}, newest first" if before else "Newest first"
    body += f'<p class="muted">{where}; {PAGE_RECORDS} records a page.</p>'
    headers = ["seq", "time", "type", "tenant", "execution", "subject", "details"]
    body += html.table(headers, rows, "audit") if rows else '<p class="muted">No records.</p>'
    body += _older_link(q, records)
    return html.page("Audit trail", body, session, active="/console/audit")
