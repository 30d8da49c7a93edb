"""The approval queue over HTTP: list, read, and decide (SPEC section 5).

A decision comes from an approver JWT with `approvals:decide` (own tenant;
`approvals:decide:all` for any), or from a callback signed with the configured
callback secret (Standard Webhooks) whose body names the approval it decides and
whose webhook id has not been seen. Nobody approves their own request. Only the
JWT path answers with an approval token.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from pydantic import ValidationError

from gateway import errors
from gateway.admission.gate import state_error
from gateway.appkeys import SERVICES
from gateway.approvals.desk import ApprovalDesk, principal_may_read
from gateway.approvals.records import Approval, ApprovalError, iso
from gateway.approvals.webhooks import SignatureError, verify
from gateway.auth.tokens import Principal
from gateway.decoders import read_json
from gateway.errors import GatewayError, invalid_field
from gateway.ingress.rest import authenticated, read_body
from gateway.json_codec import json_response
from gateway.models import DecisionRequest, format_validation_errors
from gateway.services import Services
from gateway.state.base import StateUnavailable

routes = web.RouteTableDef()

_STATUSES = {"pending", "approved", "denied", "expired", "executed"}


@routes.get("/v1/approvals")
async def list_approvals(request: web.Request) -> web.Response:
    svc = request.app[SERVICES]
    principal = await authenticated(request)
    tenant = request.query.get("tenant")
    if "approvals:read:all" not in principal.scopes:
        if "approvals:read" not in principal.scopes:
            raise GatewayError(errors.FORBIDDEN, "token lacks scope approvals:read")
        if tenant not in (None, principal.tenant):
            raise GatewayError(errors.FORBIDDEN, "approvals:read covers only your own tenant")
        tenant = principal.tenant
    status = request.query.get("status")
    if status is not None and status not in _STATUSES:
        raise invalid_field("status", f"one of {sorted(_STATUSES)}")
    try:
        limit = int(request.query.get("limit", "100"))
    except ValueError:
        raise invalid_field("limit", "must be an integer") from None
    if not 1 <= limit <= 1000:
        raise invalid_field("limit", "must be between 1 and 1000")
    approvals = await svc.approvals.store.list(status=status, tenant=tenant, limit=limit)
    return json_response({"approvals": [a.public() for a in approvals]})


@routes.get("/v1/approvals/{approval_id}")
async def get_approval(request: web.Request) -> web.Response:
    svc = request.app[SERVICES]
    principal = await authenticated(request)
    approval = await svc.approvals.get(request.match_info["approval_id"])
    if approval is None or not principal_may_read(principal, approval):
        raise GatewayError(errors.NOT_FOUND, "no such approval")
    answer = approval.public()
    # An approved request the gateway does not run itself (run_held = false, or a
    # guarded tool) is redeemed by its requester, whoever decided it (a callback gets
    # no token): they may fetch a token, bound to them and spent once per approval.
    own = principal.sub == approval.requester and principal.tenant == approval.tenant
    presented = not svc.settings.approvals.run_held or approval.language == "tool"
    if own and presented and approval.status == "approved":
        answer["approval_token"] = svc.approvals.mint(approval)
    return json_response(answer)


@routes.post("/v1/approvals/{approval_id}/decision")
async def decide(request: web.Request) -> web.Response:
    svc = request.app[SERVICES]
    approval_id = request.match_info["approval_id"]
    body = await read_body(request)
    if "webhook-signature" in request.headers and svc.approvals.callback_key is not None:
        return web.json_response(await _callback(request, svc, approval_id, body))
    principal = await authenticated(request)
    decision = _parse(body)
    if decision.approval_id not in (None, approval_id):
        raise invalid_field("approval_id", "names another approval than the URL")
    approval, token = await decide_as(svc, principal, approval_id, decision, "jwt")
    answer = approval.public()
    if token is not None:
        answer["approval_token"] = token
        answer["run_held"] = svc.settings.approvals.run_held
    return json_response(answer)


MAX_WEBHOOK_ID_CHARS = 256


async def _callback(
    request: web.Request, svc: Services, approval_id: str, body: bytes
) -> dict[str, Any]:
    """A decision signed with the callback secret (Standard Webhooks). It decides the
    approval its signed body names, once: the webhook id is spent for as long as the
    message could verify. The answer carries no approval token and no code: whoever
    holds a captured callback learns nothing from sending it."""
    desk = svc.approvals
    assert desk.callback_key is not None
    webhook_id = request.headers.get("webhook-id", "")
    approval = await desk.get(approval_id)

    async def record(record_type: str, reason: str, **fields: Any) -> None:
        await svc.audit.append(
            record_type,
            request_id=None,
            execution_id=approval.execution_id if approval else None,
            tenant=approval.tenant if approval else None,
            subject=None,
            approval_id=approval_id,
            webhook_id=webhook_id[:MAX_WEBHOOK_ID_CHARS],
            source_ip=request.remote or "",
            reason=reason,
            **fields,
        )

    async def refused(
        kind: errors.ErrorKind, reason: str, message: str, **extra: Any
    ) -> GatewayError:
        await record("approval.callback_refused", reason, code=kind.code)
        return GatewayError(kind, message, reason=reason, **extra)

    if len(webhook_id) > MAX_WEBHOOK_ID_CHARS:
        raise await refused(errors.UNAUTHENTICATED, "missing_headers", "webhook-id is too long")
    try:
        verify(
            desk.callback_key,
            request.headers,
            body,
            tolerance_s=svc.settings.approvals.callback_tolerance_s,
        )
    except SignatureError as exc:
        raise await refused(
            errors.UNAUTHENTICATED, exc.reason, f"callback signature: {exc}"
        ) from None
    decision = _parse(body)
    if decision.approval_id is None:
        raise await refused(
            errors.INVALID_REQUEST,
            "approval_id_missing",
            "approval_id: a signed callback names the approval it decides in its body",
            fields=[{"field": "approval_id", "message": "required in a signed callback"}],
        )
    if decision.approval_id != approval_id:
        raise await refused(
            errors.FORBIDDEN, "other_approval", "the callback is signed for another approval"
        )
    if approval is None:
        raise await refused(errors.NOT_FOUND, "unknown_approval", "no such approval")
    try:
        claim = await desk.claim_callback(webhook_id, approval_id, body)
    except StateUnavailable as exc:
        raise state_error(exc) from None
    if claim == "reused":
        raise await refused(
            errors.CONFLICT, "webhook_id_reused", "webhook-id was already used for another message"
        )
    if claim == "duplicate":
        # The same message again (a sender's retry, or a replay): answered, never acted on.
        await record("approval.callback_duplicate", "duplicate")
        current = await desk.store.get(approval_id) or approval
        return _callback_answer(current, webhook_id, duplicate=True)
    decided, _token = await _settle(
        desk,
        approval,
        decision.approver or "webhook",
        decision,
        "callback",
        webhook_id=webhook_id,
    )
    return _callback_answer(decided, webhook_id, duplicate=False)


def _callback_answer(approval: Approval, webhook_id: str, *, duplicate: bool) -> dict[str, Any]:
    return {
        "approval_id": approval.id,
        "status": approval.status,
        "approver": approval.approver,
        "decided_at": iso(approval.decided_at),
        "webhook_id": webhook_id,
        "duplicate": duplicate,
    }


async def decide_as(
    svc: Services, principal: Principal, approval_id: str, decision: DecisionRequest, via: str
) -> tuple[Approval, str | None]:
    """An approver's decision, checked one way for the API and the console."""
    approval = await svc.approvals.get(approval_id)
    if approval is None or not principal_may_read(principal, approval):
        raise GatewayError(errors.NOT_FOUND, "no such approval")
    tenant_ok = "approvals:decide:all" in principal.scopes or (
        "approvals:decide" in principal.scopes and principal.tenant == approval.tenant
    )
    if not tenant_ok:
        raise GatewayError(errors.FORBIDDEN, "token lacks scope approvals:decide")
    return await _settle(svc.approvals, approval, principal.sub, decision, via)


async def _settle(
    desk: ApprovalDesk,
    approval: Approval,
    approver: str,
    decision: DecisionRequest,
    via: str,
    **audit: Any,
) -> tuple[Approval, str | None]:
    if approver == approval.requester:
        raise GatewayError(
            errors.FORBIDDEN, "an approver cannot decide their own request", reason="self_approval"
        )
    try:
        return await desk.decide(
            approval.id, decision.decision, approver, decision.reason, via, **audit
        )
    except ApprovalError as exc:
        if exc.kind == "not_found":
            raise GatewayError(errors.NOT_FOUND, str(exc)) from None
        kind = errors.APPROVAL_EXPIRED if exc.kind == "expired" else errors.CONFLICT
        raise GatewayError(kind, str(exc)) from None


def _parse(body: bytes) -> DecisionRequest:
    data = read_json(body or b"null")
    try:
        return DecisionRequest.model_validate(data)
    except ValidationError as exc:
        fields = format_validation_errors(exc.errors())
        raise GatewayError(errors.INVALID_REQUEST, "invalid decision", fields=fields) from None
