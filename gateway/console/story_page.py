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


def _result_box(execution: dict[str, Any]) -> str:
    result = execution.get("result") or {}
    stdout, stderr = result.get("stdout"), result.get("stderr")
    shown = {k: v for k, v in result.items() if k not in ("stdout", "stderr")}
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
