"""validate: the ingress's payload -> ExecutionRequest, checked against what we serve."""

from __future__ import annotations

from pydantic import ValidationError

from gateway import errors
from gateway.context import ExecContext
from gateway.errors import GatewayError, invalid_field
from gateway.models import format_validation_errors
from gateway.services import Services

MAX_FILES_BYTES = 8 * 1024 * 1024


async def validate(ctx: ExecContext, svc: Services) -> None:
    try:
        request = ctx.decode(ctx)
    except ValidationError as exc:
        fields = format_validation_errors(exc.errors())
        summary = "; ".join(f"{f['field']}: {f['message']}" for f in fields[:5])
        raise GatewayError(errors.INVALID_REQUEST, summary, fields=fields) from None
    backend_name = request.backend or svc.settings.default_backend
    backend = svc.backends.get(backend_name)
    if backend is None:
        raise invalid_field("backend", f"unknown or disabled backend {backend_name!r}")
    if request.language not in backend.capabilities.languages:
        served = ", ".join(sorted(backend.capabilities.languages))
        raise invalid_field(
            "language",
            f"{request.language!r} is not served by backend {backend_name} (serves: {served})",
        )
    limit = svc.settings.server.max_code_bytes
    if len(request.code) > limit // 4 and len(request.code.encode("utf-8")) > limit:
        raise invalid_field("code", f"over {limit} bytes")
    total = sum(len(f.content_b64) * 3 // 4 for f in request.files)
    if total > MAX_FILES_BYTES:
        raise invalid_field("files", f"total size over {MAX_FILES_BYTES} bytes")
    ctx.request = request
    ctx.backend = backend_name
