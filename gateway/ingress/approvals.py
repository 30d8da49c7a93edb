"""The approval queue over HTTP: list, read, and decide (SPEC section 5).

A decision comes from an approver JWT with `approvals:decide` (own tenant;
`approvals:decide:all` for any), or from a callback signed with the configured
callback secret (Standard Webhooks). Nobody approves their own request.
"""

from __future__ import annotations

from aiohttp import web
from pydantic import ValidationError

from gateway import errors
from gateway.appkeys import SERVICES
from gateway.approval_desk import ApprovalDesk, principal_may_read
from gateway.approvals import Approval, ApprovalError
from gateway.decoders import read_json
from gateway.errors import GatewayError, invalid_field
from gateway.ingress.rest import authenticated, read_body
from gateway.json_codec import json_response
from gateway.models import DecisionRequest, format_validation_errors
from gateway.services import Services
from gateway.tokens import Principal
from gateway.webhooks import SignatureError, verify

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
    approval = await svc.approvals.store.get(request.match_info["approval_id"])
    if approval is None or not principal_may_read(principal, approval):
        raise GatewayError(errors.NOT_FOUND, "no such approval")
    return json_response(approval.public())


@routes.post("/v1/approvals/{approval_id}/decision")
async def decide(request: web.Request) -> web.Response:
    svc = request.app[SERVICES]
    desk = svc.approvals
    approval_id = request.match_info["approval_id"]
    body = await read_body(request)
    if "webhook-signature" in request.headers and desk.callback_key is not None:
        try:
            verify(
                desk.callback_key,
                request.headers,
                body,
                tolerance_s=svc.settings.approvals.callback_tolerance_s,
            )
        except SignatureError as exc:
            raise GatewayError(errors.UNAUTHENTICATED, f"callback signature: {exc}") from None
        decision = _parse(body)
        approval = await desk.store.get(approval_id)
        if approval is None:
            raise GatewayError(errors.NOT_FOUND, "no such approval")
        approval, token = await _settle(
            desk, approval, decision.approver or "webhook", decision, "callback"
        )
    else:
        principal = await authenticated(request)
        decision = _parse(body)
        approval, token = await decide_as(svc, principal, approval_id, decision, "jwt")
    answer = approval.public()
    if token is not None:
        answer["approval_token"] = token
        answer["run_held"] = svc.settings.approvals.run_held
    return json_response(answer)


async def decide_as(
    svc: Services, principal: Principal, approval_id: str, decision: DecisionRequest, via: str
) -> tuple[Approval, str | None]:
    """An approver's decision, checked one way for the API and the console."""
    approval = await svc.approvals.store.get(approval_id)
    if approval is None or not principal_may_read(principal, approval):
        raise GatewayError(errors.NOT_FOUND, "no such approval")
    tenant_ok = "approvals:decide:all" in principal.scopes or (
        "approvals:decide" in principal.scopes and principal.tenant == approval.tenant
    )
    if not tenant_ok:
        raise GatewayError(errors.FORBIDDEN, "token lacks scope approvals:decide")
    return await _settle(svc.approvals, approval, principal.sub, decision, via)


async def _settle(
    desk: ApprovalDesk, approval: Approval, approver: str, decision: DecisionRequest, via: str
) -> tuple[Approval, str | None]:
    if approver == approval.requester:
        raise GatewayError(
            errors.FORBIDDEN, "an approver cannot decide their own request", reason="self_approval"
        )
    try:
        return await desk.decide(approval.id, decision.decision, approver, decision.reason, via)
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
