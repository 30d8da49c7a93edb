"""build_input: the policy input document (SPEC section 4), as a pure function.

Tokens never appear here; claims do. Code appears once, with its hash and size.
"""

from __future__ import annotations

import hashlib
from typing import Any

from gateway.context import ExecContext, rfc3339
from gateway.services import Services

INPUT_VERSION = "execgate.input/v1"
_CEILING_KEYS = ("timeout_s", "memory_mb", "cpus", "pids", "disk_mb", "output_bytes")


def policy_input(ctx: ExecContext, usage: dict[str, Any]) -> dict[str, Any]:
    principal, request, tenant = ctx.principal, ctx.request, ctx.tenant
    assert principal is not None and request is not None and tenant is not None
    code_bytes = request.code.encode("utf-8")
    files = []
    for f in request.files:
        content = f.content()
        files.append(
            {"path": f.path, "bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}
        )
    requested = request.limits.model_dump(exclude_none=True)
    document: dict[str, Any] = {
        "version": INPUT_VERSION,
        "request": {
            "id": ctx.request_id,
            "time": rfc3339(ctx.received_at),
            "ingress": ctx.ingress,
            "tool_name": ctx.tool_name,
            "source_ip": ctx.source_ip,
        },
        "subject": {
            "sub": principal.sub,
            "tenant": principal.tenant,
            "scopes": sorted(principal.scopes),
            "claims": principal.claims,
        },
        "tenant": {
            "id": principal.tenant,
            "ceilings": {k: getattr(tenant, k) for k in _CEILING_KEYS},
            "languages": list(tenant.languages),
            "usage": usage,
        },
        "execution": {
            "language": request.language,
            "code": request.code,
            "code_sha256": hashlib.sha256(code_bytes).hexdigest(),
            "code_bytes": len(code_bytes),
            "files": files,
            "limits": requested,
            "egress": list(request.network.egress),
            "backend": ctx.backend,
        },
        "analysis": ctx.analysis or {"parsed": False, "imports": [], "calls": [], "features": []},
        "approval": ctx.approval or {"present": False},
    }
    if ctx.tool_call is not None:
        # A non-code tool: `execution.language` is "tool" and its code the arguments.
        document["tool"] = ctx.tool_call
    return document


async def build_input(ctx: ExecContext, svc: Services) -> None:
    assert ctx.principal is not None and ctx.tenant is not None
    usage = await svc.admission.usage(ctx.principal.tenant, ctx.tenant)
    ctx.policy_input = policy_input(ctx, usage)
