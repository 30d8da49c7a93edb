"""One execution's story: every audit record that names it, in order, with its result.

Records are rendered generically (any type, every field), so what later layers add
(network attempts, sandbox events...) is shown as soon as it is audited.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from gateway import errors
from gateway.appkeys import SERVICES
from gateway.approvals.desk import principal_may_read
from gateway.audit.read import query
from gateway.console import html
from gateway.console.audit_page import HEAD, READ, chain_box, record_kind, type_label
from gateway.console.guard import require
from gateway.console.highlight import highlight
from gateway.console.session import Session
from gateway.errors import GatewayError
from gateway.executions.live import follow_execution
from gateway.ingress.sse import open_stream, send

routes = web.RouteTableDef()

STORY_RECORDS = 1000
LIVE_STATUSES = ("running", "pending_approval")
# How long one events connection waits for a held execution before the browser's
# EventSource reconnects by itself.
LIVE_WAIT_S = 30.0


def _record_card(record: dict[str, Any]) -> str:
    kind = record_kind(str(record.get("type")))
    return (
        f'<article class="record r-{kind}">'
        f"<header>{type_label(record.get('type'))}"
        f'<span class="muted">#{html.esc(record.get("seq"))} · {html.esc(record.get("ts"))}'
        "</span></header>"
        + html.fields(record, skip=HEAD)
        + f'<p class="hash">hash {html.esc(record.get("hash", ""))}</p></article>'
    )


def _behaviour_box(records: list[dict[str, Any]], execution: dict[str, Any] | None) -> str:
    """What the code tried, flagged first: from the audit log (the review and the
    behaviour record), else from the stored result."""
    review = next((r for r in reversed(records) if r.get("type") == "execution.review"), None)
    record = next((r for r in reversed(records) if r.get("type") == "execution.behaviour"), None)
    result = (execution or {}).get("result") or {}
    stored = result.get("behaviour") or {}
    flags = (review or {}).get("flags") or stored.get("flags") or []
    tried = record or stored
    network = [r for r in records if r.get("type") == "network.attempt"] or result.get(
        "network", []
    )
    if not (flags or tried or network):
        return ""
    parts = ['<section class="card behaviour"><h2>What the code tried</h2>']
    if tried.get("capture") == "off":
        parts.append(
            f'<p class="muted">Capture was off: {html.esc(tried.get("reason") or "unknown")}</p>'
        )
    if flags:
        parts.append("<h3>Flagged by the review</h3>")
        parts.append(html.table(
            ["severity", "rule", "detail"],
            [[html.badge(str(f.get("severity"))), html.esc(f.get("rule")),
              html.esc(f.get("detail"))] for f in flags if isinstance(f, dict)],
            "flags",
        ))  # fmt: skip
    if review is not None and review.get("error"):
        parts.append(f'<p class="error">Review: {html.esc(review["error"])}</p>')

    def failed_first(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return sorted(entries, key=lambda e: e.get("result") == "ok")

    files = failed_first([f for f in tried.get("files", []) if isinstance(f, dict)])
    if files:
        parts.append("<h3>Files</h3>" + html.table(
            ["operation", "path", "result", "times"],
            [[html.esc(f.get("op")), html.esc(f.get("path")), html.badge(str(f.get("result"))),
              html.esc(f.get("count"))] for f in files],
            "attempts",
        ))  # fmt: skip
    programs = failed_first([p for p in tried.get("programs", []) if isinstance(p, dict)])
    if programs:
        parts.append("<h3>Programs</h3>" + html.table(
            ["program", "arguments", "result", "times"],
            [[html.esc(p.get("path")), html.value(p.get("argv")), html.badge(str(p.get("result"))),
              html.esc(p.get("count"))] for p in programs],
            "attempts",
        ))  # fmt: skip
    signals = failed_first([x for x in tried.get("signals", []) if isinstance(x, dict)])
    if signals:
        parts.append("<h3>Signals and tracing</h3>" + html.table(
            ["call", "target pid", "signal / request", "result", "times"],
            [[html.esc(x.get("syscall")), html.esc(x.get("target")), html.esc(x.get("signal")),
              html.badge(str(x.get("result"))), html.esc(x.get("count"))] for x in signals],
            "attempts",
        ))  # fmt: skip
    refused = tried.get("syscalls_refused") or {}
    if isinstance(refused, dict) and refused:
        parts.append("<h3>Refused system calls</h3>" + html.table(
            ["system call", "times"],
            [[html.esc(name), html.esc(n)] for name, n in sorted(refused.items())],
            "chart",
        ))  # fmt: skip
    if network:
        parts.append("<h3>Network</h3>" + html.table(
            ["kind", "destination", "verdict", "rule"],
            [[html.esc(a.get("kind")), html.esc(f"{a.get('host')}:{a.get('port')}"),
              html.badge(str(a.get("verdict"))), html.esc(a.get("rule"))]
             for a in sorted(network, key=lambda a: a.get("verdict") != "blocked")],
            "attempts",
        ))  # fmt: skip
    if tried.get("dropped"):
        parts.append(
            f'<p class="muted">{html.esc(tried["dropped"])} more attempts beyond the'
            " record's caps (counted, not kept).</p>"
        )
    parts.append("</section>")
    return "".join(parts)


def _result_box(execution: dict[str, Any]) -> str:
    result = execution.get("result") or {}
    stdout, stderr = result.get("stdout"), result.get("stderr")
    shown = {
        k: v for k, v in result.items() if k not in ("stdout", "stderr", "behaviour", "network")
    }
    parts = [
        f'<section class="card result"><h2>Result {html.badge(str(execution.get("status")))}</h2>',
        html.fields(shown),
    ]
    if execution.get("error"):
        parts.append(html.fields({"error": execution["error"]}))
    for name, text in (("stdout", stdout), ("stderr", stderr)):
        if text:
            parts.append(f'<h3>{name}</h3><pre class="output">{html.esc(text)}</pre>')
    parts.append("</section>")
    return "".join(parts)


async def _held_request(
    request: web.Request, session: Session, records: list[dict[str, Any]]
) -> str:
    """The code itself, when it was held for approval and the reader may see approvals.

    Audit records carry only the code's hash; the approval store keeps the request.
    """
    ids = [r["approval_id"] for r in records if r.get("type") == "approval.requested"]
    if not ids or not session.has("approvals:read", "approvals:read:all"):
        return ""
    approval = await request.config_dict[SERVICES].approvals.store.get(str(ids[-1]))
    if approval is None or not principal_may_read(session.principal(), approval):
        return ""
    public = approval.public()
    code = await asyncio.to_thread(highlight, public["code"], approval.language)
    limits = {k: v for k, v in public["limits"].items() if v is not None}
    return (
        '<section class="card request"><h2>Request</h2>'
        + html.fields(
            {
                "requester": approval.requester,
                "language": approval.language,
                "limits": limits or "defaults",
                "egress": public["egress"],
                "approval": f"{approval.id} ({approval.status})",
            }
        )
        + f'<pre class="code">{code}</pre></section>'
    )


@routes.get("/executions/{execution_id}")
async def execution_story(request: web.Request) -> web.Response:
    session = require(request, *READ)
    svc = request.config_dict[SERVICES]
    execution_id = request.match_info["execution_id"]
    tenant = None if session.has("audit:read:all") else session.tenant
    records = await query(
        svc.settings.audit.path, tenant=tenant, execution_id=execution_id, limit=STORY_RECORDS
    )
    execution = await svc.store.get(execution_id)
    if execution is not None and tenant is not None and execution.get("tenant") != tenant:
        execution = None  # another tenant's execution is indistinguishable from none
    if not records and execution is None:
        raise GatewayError(errors.NOT_FOUND, "no such execution")
    body = await chain_box(request)
    body += html.fields(
        {"execution": execution_id, "tenant": (execution or records[0]).get("tenant")}
    )
    body += await _held_request(request, session, records)
    if execution is not None and execution.get("status") in LIVE_STATUSES:
        # console.js follows the events and reloads the page when the result is in.
        events = html.esc(f"/console/executions/{execution_id}/events")
        body += (
            f'<section class="card live"><h2>Live output {html.badge(str(execution["status"]))}'
            f'</h2><pre class="output" id="live-output" data-events="{events}"></pre></section>'
        )
    elif execution is not None:
        body += _result_box(execution)
    body += _behaviour_box(records, execution)
    body += f'<h2 class="section">Story <span class="count">{len(records)}</span></h2>'
    body += '<div class="timeline">' + "".join(_record_card(r) for r in records) + "</div>"
    return html.page(f"Execution {execution_id}", body, session, active="/console/audit")


@routes.get("/executions/{execution_id}/events")
async def execution_events(request: web.Request) -> web.StreamResponse:
    """The execution's output as it is printed (Server-Sent Events), for the page above."""
    session = require(request, *READ)
    svc = request.config_dict[SERVICES]
    execution_id = request.match_info["execution_id"]
    execution = await svc.store.get(execution_id)
    tenant = None if session.has("audit:read:all") else session.tenant
    if execution is None or (tenant is not None and execution.get("tenant") != tenant):
        raise GatewayError(errors.NOT_FOUND, "no such execution")
    resp = await open_stream(request)
    async for event, data in follow_execution(svc.store, svc.live, execution_id, LIVE_WAIT_S):
        if not await send(resp, event, data):
            break
    return resp
