"""dispatch: the admitted request -> one fresh sandbox -> the result, recorded."""

from __future__ import annotations

import time

from backends.base import BackendError, ExecSpec, InputFile
from gateway import errors
from gateway.context import ExecContext
from gateway.errors import GatewayError
from gateway.results import render_result
from gateway.services import Services


def build_spec(ctx: ExecContext) -> ExecSpec:
    assert ctx.request and ctx.limits and ctx.decision
    return ExecSpec(
        execution_id=ctx.execution_id,
        language=ctx.request.language,
        code=ctx.request.code,
        limits=ctx.limits,
        stdin=ctx.request.stdin.encode("utf-8"),
        files=tuple(InputFile(f.path, f.content()) for f in ctx.request.files),
        egress=tuple(ctx.decision.obligations.egress or ()),
    )


async def dispatch(ctx: ExecContext, svc: Services) -> None:
    assert ctx.backend and ctx.limits and ctx.principal
    backend = svc.backends[ctx.backend]
    held = svc.out_of_service.get(ctx.backend)
    if held:
        raise GatewayError(
            errors.BACKEND_UNAVAILABLE, f"sandbox backend {ctx.backend} is out of service: {held}"
        )
    spec = build_spec(ctx)
    # Durable before anything runs: an execution the log does not know of never happens.
    await svc.audit.append(
        "execution.started",
        **ctx.audit_fields(),
        backend=ctx.backend,
        language=spec.language,
        limits=ctx.limits.as_dict(),
        egress=list(spec.egress),
    )
    svc.store.started(ctx.execution_id, ctx.principal.tenant)
    started = time.perf_counter()
    try:
        result = await backend.run(spec)
    except BackendError as exc:
        svc.metrics.observe_execution(ctx.backend, "backend_error", time.perf_counter() - started)
        raise GatewayError(
            errors.BACKEND_UNAVAILABLE, f"sandbox backend {ctx.backend} failed: {exc}"
        ) from None
    ctx.result = result
    svc.metrics.observe_execution(ctx.backend, result.status.value, time.perf_counter() - started)
    svc.admission.charge_cpu(ctx.principal.tenant, result.usage.cpu_ms / 1000)
    await svc.audit.append(
        "execution.finished",
        **ctx.audit_fields(),
        backend=ctx.backend,
        status=result.status.value,
        exit_code=result.exit_code,
        duration_ms=result.duration_ms,
        usage={"cpu_ms": result.usage.cpu_ms, "max_rss_kb": result.usage.max_rss_kb},
        limits=ctx.limits.as_dict(),
        stdout_bytes=len(result.stdout),
        stderr_bytes=len(result.stderr),
        files=[{"path": f.path, "size": f.size} for f in result.files],
        events=[{"kind": e.kind, "detail": e.detail} for e in result.events],
    )
    svc.store.finished(ctx.execution_id, render_result(ctx))
