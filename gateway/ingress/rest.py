"""The REST ingress: `POST /v1/executions` and `GET /v1/executions/{id}`."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway import errors
from gateway.appkeys import PIPELINE, SERVICES
from gateway.context import ExecContext, new_id
from gateway.decoders import decode_json_body
from gateway.errors import GatewayError, invalid_field
from gateway.json_codec import json_response
from gateway.stages.auth import verify_bearer
from gateway.tokens import Principal

routes = web.RouteTableDef()


def bearer_token(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


async def read_body(request: web.Request) -> bytes:
    limit = request.app[SERVICES].settings.server.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise GatewayError(errors.TOO_LARGE, f"body over {limit} bytes", limit_bytes=limit)
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise GatewayError(
            errors.TOO_LARGE, f"body over {limit} bytes", limit_bytes=limit
        ) from None


def new_context(request: web.Request, ingress: str, body: bytes) -> ExecContext:
    return ExecContext(
        ingress=ingress,
        source_ip=request.remote or "",
        bearer=bearer_token(request),
        payload=body,
        decode=decode_json_body,
    )


@routes.post("/v1/executions")
async def create_execution(request: web.Request) -> web.Response:
    body = await read_body(request)
    ctx = await request.app[PIPELINE].run(new_context(request, "rest", body))
    if ctx.held is not None:
        return json_response(held_body(ctx), status=202)
    record = await request.app[SERVICES].store.get(ctx.execution_id)
    assert record is not None and record["result"] is not None
    return json_response(record["result"])


def held_body(ctx: ExecContext) -> dict[str, object]:
    approval = ctx.held
    assert approval is not None
    public = approval.public()
    return {
        "status": "pending_approval",
        "approval_id": approval.id,
        "execution_id": ctx.execution_id,
        "expires_at": public["expires_at"],
        "reasons": approval.reasons,
    }


@routes.get("/v1/executions/{execution_id}")
async def get_execution(request: web.Request) -> web.Response:
    svc = request.app[SERVICES]
    principal = await authenticated(request)
    wait_s = _wait_param(request, svc.settings.server.max_wait_s)
    record = await svc.store.get(request.match_info["execution_id"], wait_s=wait_s)
    # Another tenant's execution is indistinguishable from a missing one.
    if record is None or record["tenant"] != principal.tenant:
        raise GatewayError(errors.NOT_FOUND, "no such execution")
    return json_response(record)


async def authenticated(request: web.Request, ingress: str = "rest") -> Principal:
    """Verify the bearer of a non-pipeline request; a failure is audited like any other."""
    svc = request.app[SERVICES]
    try:
        return await verify_bearer(svc, bearer_token(request))
    except GatewayError as exc:
        await audit_edge(
            request,
            "auth.failed",
            None,
            ingress,
            path=request.path,
            code=exc.code,
            outcome=exc.kind.outcome,
            message=exc.message,
        )
        raise


async def audit_edge(
    request: web.Request, type_: str, principal: Principal | None, ingress: str, **fields: Any
) -> None:
    """A durable record of something an ingress did outside the pipeline."""
    await request.app[SERVICES].audit.append(
        type_,
        request_id=new_id("req"),
        execution_id=None,
        tenant=principal.tenant if principal else None,
        subject=principal.sub if principal else None,
        ingress=ingress,
        source_ip=request.remote or "",
        **fields,
    )


def _wait_param(request: web.Request, max_wait_s: float) -> float:
    raw = request.query.get("wait")
    if raw is None:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise invalid_field("wait", "must be a number of seconds") from None
    if not 0 <= value <= max_wait_s or value != value:
        raise invalid_field("wait", f"must be between 0 and {max_wait_s}")
    return value
