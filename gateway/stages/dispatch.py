"""dispatch: the admitted request -> one fresh sandbox -> the result, recorded."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import Any

from backends.base import BackendError, ExecResult, ExecSpec, InputFile, SandboxEvent
from gateway import errors
from gateway.admission.gate import tenant_label
from gateway.audit.log import AuditUnavailable
from gateway.context import ExecContext
from gateway.egress_credentials import credentials_for
from gateway.errors import GatewayError
from gateway.services import Services

log = logging.getLogger(__name__)


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
    credentials = await credentials_for(svc.settings.egress, ctx.principal.tenant, spec.egress)
    if not svc.audit.healthy:
        # The last write failed (disk full?): refuse until the writer's own retry gets
        # through, rather than gamble that this record happens to fit.
        raise GatewayError(errors.AUDIT_UNAVAILABLE, f"audit log unavailable: {svc.audit.problem}")
    # Durable before anything runs: an execution the log does not know of never
    # happens. The backend waits for it at the hand-over (the spec's gate), so its
    # fsync overlaps the sandbox being made ready for this request.
    recorded = svc.audit.submit(
        "execution.started",
        **ctx.audit_fields(),
        backend=ctx.backend,
        language=spec.language,
        limits=ctx.limits.as_dict(),
        egress=list(spec.egress),
    )
    live = svc.live.open(ctx.execution_id)
    ctx.cleanup.callback(svc.live.close, live)

    async def gate() -> None:
        await asyncio.shield(recorded)  # raises AuditUnavailable: nothing is handed over
        if not ctx.running.is_set():
            svc.store.started(ctx.execution_id, ctx.principal.tenant)
            ctx.running.set()

    started = time.perf_counter()
    try:
        internal_allow = tuple(svc.settings.egress.internal_allow)
        result = await backend.run(
            dataclasses.replace(
                spec, credentials=credentials, internal_allow=internal_allow,
                on_output=live.feed, gate=gate,
            )
        )  # fmt: skip
        live.close()
        if not ctx.running.is_set():
            log.error("backend %s returned a result without passing the gate", ctx.backend)
        await gate()  # whatever the backend did, the record is durable before the answer
    except BackendError as exc:
        svc.metrics.observe_execution(ctx.backend, "backend_error", time.perf_counter() - started)
        await asyncio.shield(recorded)  # submitted: durable (or the log's failure) first
        svc.store.failed(  # if it was handed over (and so is in the store)
            ctx.execution_id, {"code": errors.BACKEND_UNAVAILABLE.code, "message": str(exc)}
        )
        # The sandboxes that failed to start on the way (nothing ran in them).
        await _record_events(ctx, svc, exc.events)
        raise GatewayError(
            errors.BACKEND_UNAVAILABLE, f"sandbox backend {ctx.backend} failed: {exc}"
        ) from None
    except asyncio.CancelledError:
        # Shutdown past its grace (or a closing desk): the backend has killed the
        # sandbox; queued now, synchronously, so the audit log's close still writes it.
        svc.metrics.observe_execution(ctx.backend, "cancelled", time.perf_counter() - started)
        reason = "gateway shutting down: killed after the grace period"
        svc.store.failed(ctx.execution_id, {"code": "cancelled", "message": reason})
        with contextlib.suppress(AuditUnavailable):  # a closed log: readiness already says so
            svc.audit.submit(
                "execution.finished", **ctx.audit_fields(), backend=ctx.backend,
                status="cancelled", reason=reason,
            )  # fmt: skip
        raise
    ctx.result = result
    svc.metrics.observe_execution(ctx.backend, result.status.value, time.perf_counter() - started)
    await svc.admission.charge_cpu(ctx.principal.tenant, result.usage.cpu_ms / 1000)
    svc.metrics.executed(tenant_label(svc.settings, ctx.principal.tenant), result.status.value)
    # Queued, not awaited: the review stage (and the pipeline's settle) waits for it
    # with the records that follow, so one fsync covers them all; durable before the
    # result is stored or answered, like every record.
    ctx.audit_pending.append(svc.audit.queue(
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
        capture=result.behaviour.capture if result.behaviour is not None else "off",
    ))  # fmt: skip
    _record_attempts(ctx, svc, result)


def _record_attempts(ctx: ExecContext, svc: Services, result: ExecResult) -> None:
    """One `network.attempt` per recorded attempt and one `sandbox.event` per
    event, queued with the request's records (both bounded by the backend's record)."""
    fields = {**ctx.audit_fields(), "backend": ctx.backend}
    ctx.audit_pending.extend(
        svc.audit.queue("network.attempt", **fields, **dataclasses.asdict(a))
        for a in result.network
    )
    ctx.audit_pending.extend(_queue_events(ctx, svc, result.events))


def _queue_events(
    ctx: ExecContext, svc: Services, events: tuple[SandboxEvent, ...]
) -> list[asyncio.Future[dict[str, Any]]]:
    fields = {**ctx.audit_fields(), "backend": ctx.backend}
    return [svc.audit.queue("sandbox.event", **fields, **dataclasses.asdict(e)) for e in events]


async def _record_events(ctx: ExecContext, svc: Services, events: tuple[SandboxEvent, ...]) -> None:
    queued = _queue_events(ctx, svc, events)
    svc.audit.kick()
    await asyncio.gather(*queued)
