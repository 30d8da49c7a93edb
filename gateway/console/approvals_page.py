"""The approvals page: what waits for a person, and the decisions made lately.

Decisions go through `decide_as`, the API's own path: the same scope and tenant
checks, no self-approval, single-use, audited (`via: console`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from gateway import errors
from gateway.appkeys import SERVICES
from gateway.approvals.records import Approval, iso
from gateway.console import html
from gateway.console.guard import form_of, require
from gateway.console.highlight import highlight
from gateway.console.session import Session
from gateway.errors import GatewayError
from gateway.ingress.approvals import decide_as
from gateway.models import DecisionRequest

routes = web.RouteTableDef()

READ = ("approvals:read", "approvals:read:all")


def _may_decide(session: Session, approval: Approval) -> bool:
    return session.has("approvals:decide:all") or (
        session.has("approvals:decide") and session.tenant == approval.tenant
    )


def _time_left(expires_at: float) -> str:
    left = max(0, int(expires_at - time.time()))
    text = f"{left // 60}m {left % 60:02d}s left" if left else "expired"
    return f'<span class="countdown" data-expires="{html.esc(iso(expires_at))}">{text}</span>'


def _decision_form(session: Session, approval: Approval) -> str:
    if approval.requester == session.sub:
        return '<p class="muted">Your own request: somebody else must decide it.</p>'
    if not _may_decide(session, approval):
        return '<p class="muted">Your token cannot decide (needs approvals:decide).</p>'
    action = f"/console/approvals/{approval.id}/decision"
    return (
        f'<form method="post" action="{html.esc(action)}" class="decision">'
        f"{html.csrf_field(session)}"
        f'<label for="reason-{html.esc(approval.id)}">Reason</label>'
        f'<textarea id="reason-{html.esc(approval.id)}" name="reason" rows="2" '
        'maxlength="2000"></textarea><div class="buttons">'
        '<button type="submit" name="decision" value="approve" class="approve">Approve</button>'
        '<button type="submit" name="decision" value="deny" class="deny">Deny</button>'
        "</div></form>"
    )


def _shown(label: str, shown: dict[str, Any]) -> str:
    """One input (a file or stdin): its size and hash, and its text when it is shown."""
    head = (
        f'<h4>{html.esc(label)} <span class="muted">{html.esc(shown["bytes"])} bytes, '
        f"sha256 {html.esc(shown['sha256'])}</span></h4>"
    )
    if shown["content"] is None:
        return head + '<p class="muted">not text, or too large to show: check it by its hash</p>'
    return head + f'<pre class="code input">{html.esc(shown["content"])}</pre>'


def _inputs(public: dict[str, Any]) -> str:
    """Every input file and stdin: the approval binds all of them, so all are shown."""
    parts = [_shown(f["path"], f) for f in public["files"]]
    body = "<h3>Input files</h3>" + ("".join(parts) or '<p class="muted">none</p>')
    stdin = public["stdin"]
    if stdin["bytes"]:
        body += _shown("stdin", stdin)
    else:
        body += '<h3>stdin</h3><p class="muted">empty</p>'
    return body


async def _pending_card(session: Session, approval: Approval) -> str:
    public = approval.public()
    code = await asyncio.to_thread(highlight, public["code"], approval.language)
    limits = {k: v for k, v in public["limits"].items() if v is not None}
    bound = {
        "tenant": approval.tenant,
        "approval": approval.id,
        "execution": approval.execution_id,
        "requested": public["created_at"],
        "backend": approval.backend or "",
        "code sha256": approval.code_sha256,
    }
    if approval.tool is not None:
        bound["tool"] = f"{approval.tool.get('name')} on {approval.tool.get('server')}"
    return (
        f'<article class="card approval" id="{html.esc(approval.id)}">'
        f"<header><h2>{html.esc(approval.language)} from {html.esc(approval.requester)}</h2>"
        f"{_time_left(approval.expires_at)}</header>"
        + html.fields(bound)
        + "<h3>Why it is held</h3>"
        + html.items(approval.reasons, "no reason given")
        + "<h3>Analysis features</h3>"
        + html.value(approval.features)
        + '<div class="two"><div><h3>Requested limits</h3>'
        + (html.fields(limits) or '<p class="muted">defaults</p>')
        + "</div><div><h3>Requested egress</h3>"
        + html.items(public["egress"], "no network")
        + "</div></div>"
        + f'<h3>Code</h3><pre class="code">{code}</pre>'
        + _inputs(public)
        + _decision_form(session, approval)
        + "</article>"
    )


def _recent_row(approval: Approval, session: Session) -> list[str]:
    public = approval.public()
    execution = html.esc(approval.execution_id)
    if session.has("audit:read", "audit:read:all"):
        href = html.esc(f"/console/executions/{approval.execution_id}")
        execution = f'<a href="{href}">{execution}</a>'
    return [
        html.esc(public["decided_at"] or public["expires_at"]),
        html.esc(approval.tenant),
        html.esc(approval.requester),
        html.badge(approval.status),
        html.value(approval.approver),
        html.esc(approval.decision_reason),
        execution,
    ]


@routes.get("/approvals")
async def approvals_page(request: web.Request) -> web.Response:
    session = require(request, *READ)
    store = request.config_dict[SERVICES].approvals.store
    tenant = None if session.has("approvals:read:all") else session.tenant
    pending = await store.list(status="pending", tenant=tenant, limit=100)
    now = time.time()
    pending = [a for a in pending if a.expires_at > now]
    recent = [a for a in await store.list(tenant=tenant, limit=100) if a.status != "pending"]
    body = _notice(request.query.get("decided"), recent)
    body += f'<h2 class="section">Pending <span class="count">{len(pending)}</span></h2>'
    cards = [await _pending_card(session, a) for a in pending]
    body += "".join(cards) or '<p class="muted empty">Nothing is waiting for a decision.</p>'
    body += '<h2 class="section">Recent decisions</h2>'
    headers = ["when", "tenant", "requester", "status", "approver", "reason", "execution"]
    rows = [_recent_row(a, session) for a in recent[:25]]
    body += html.table(headers, rows, "recent") if rows else '<p class="muted">None yet.</p>'
    return html.page("Approvals", body, session, active="/console/approvals")


def _notice(decided: str | None, recent: list[Approval]) -> str:
    for approval in recent:
        if approval.id == decided:
            return (
                f'<p class="notice">Decision recorded: {html.esc(approval.id)} is '
                f"{html.badge(approval.status)}</p>"
            )
    return ""


@routes.post("/approvals/{approval_id}/decision")
async def decide(request: web.Request) -> web.Response:
    session = require(request, *READ)
    form = await form_of(request, session)
    try:
        decision = DecisionRequest.model_validate(
            {"decision": form.get("decision"), "reason": form.get("reason", "")}
        )
    except ValidationError:
        raise GatewayError(errors.INVALID_REQUEST, "choose approve or deny") from None
    approval_id = request.match_info["approval_id"]
    svc = request.config_dict[SERVICES]
    await decide_as(svc, session.principal(), approval_id, decision, "console")
    return html.redirect(f"/console/approvals?decided={approval_id}")
