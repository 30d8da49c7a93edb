"""`GET /v1/audit`: audit records for security teams (scope `audit:read`).

`audit:read` sees its own tenant's records; `audit:read:all` sees every tenant's,
including records that belong to no tenant (start-up, failed authentication).
Oldest first, paged with `after_seq`; or `order=desc`: newest first (read backwards
from the end of the log), paged with `before` = the last seq of the previous page.
"""

from __future__ import annotations

from aiohttp import web

from gateway import errors
from gateway.appkeys import SERVICES
from gateway.audit.read import query
from gateway.errors import GatewayError, invalid_field
from gateway.ingress.rest import authenticated
from gateway.review.document import SEVERITIES

routes = web.RouteTableDef()

MAX_LIMIT = 1000


# Behaviour record sections `attempt=` selects by.
ATTEMPT_KINDS = ("files", "programs", "signals", "syscalls_refused")


def _int_param(request: web.Request, name: str, default: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise invalid_field(name, "must be an integer") from None
    if not 0 <= value <= high:
        raise invalid_field(name, f"must be between 0 and {high}")
    return value


@routes.get("/v1/audit")
async def list_audit(request: web.Request) -> web.Response:
    svc = request.app[SERVICES]
    principal = await authenticated(request)
    scopes = principal.scopes
    if "audit:read:all" in scopes:
        tenant = request.query.get("tenant")
    elif "audit:read" in scopes:
        tenant = request.query.get("tenant", principal.tenant)
        if tenant != principal.tenant:
            raise GatewayError(errors.FORBIDDEN, "audit:read covers only your own tenant")
    else:
        raise GatewayError(errors.FORBIDDEN, "token lacks scope audit:read", scope="audit:read")
    limit = _int_param(request, "limit", 100, MAX_LIMIT)
    after_seq = _int_param(request, "after_seq", 0, 2**62)
    before = _int_param(request, "before", 0, 2**62)
    order = request.query.get("order", "asc")
    if order not in ("asc", "desc"):
        raise invalid_field("order", "must be asc or desc")
    if before and order != "desc":
        raise invalid_field("before", "needs order=desc (page forward with after_seq)")
    flagged = request.query.get("flagged", "false")
    if flagged not in ("true", "false"):
        raise invalid_field("flagged", "must be true or false")
    severity = request.query.get("severity")
    if severity is not None and severity not in SEVERITIES:
        raise invalid_field("severity", f"must be one of {', '.join(SEVERITIES)}")
    attempt = request.query.get("attempt")
    if attempt is not None and attempt not in ATTEMPT_KINDS:
        raise invalid_field("attempt", f"must be one of {', '.join(ATTEMPT_KINDS)}")
    try:
        records = await query(
            svc.settings.audit.path,
            tenant=tenant,
            type=request.query.get("type"),
            since=request.query.get("since"),
            execution_id=request.query.get("execution_id"),
            after_seq=after_seq,
            before_seq=before,
            limit=limit,
            descending=order == "desc",
            flagged=flagged == "true",
            severity=severity,
            attempt=attempt,
        )
    except ValueError as exc:
        raise invalid_field("since", str(exc)) from None
    more = records[-1]["seq"] if len(records) == limit else None
    if order == "desc":
        return web.json_response({"records": records, "next_before": more})
    return web.json_response({"records": records, "next_after_seq": more})
