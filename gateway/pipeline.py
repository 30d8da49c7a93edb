"""The pipeline: every ingress hands an ExecContext here, and the order of the
stages is written once, in `STAGES`.

A stage either fills in the context or raises GatewayError. Whatever happens, the
request ends with a terminal audit record that is durable before the caller gets
an answer; the recording is shielded from cancellation so a client that hangs up
cannot make an attempt vanish from the log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from gateway import errors
from gateway.approvals.records import iso
from gateway.audit.log import AuditUnavailable
from gateway.context import ExecContext
from gateway.errors import GatewayError
from gateway.services import Services
from gateway.stages import (
    Held,
    admit,
    analyse,
    authenticate,
    authorize,
    build_input,
    decide,
    dispatch,
    hold_for_approval,
    redeem_approval,
    review,
    validate,
)
from gateway.telemetry import logs

log = logging.getLogger(__name__)

Stage = Callable[[ExecContext, Services], Awaitable[None]]

STAGES: tuple[Stage, ...] = (
    authenticate,  # bearer JWT -> principal
    validate,  # body -> ExecutionRequest, backend and language served
    authorize,  # scope exec:<language>
    analyse,  # code -> imports, calls, features
    redeem_approval,  # a presented approval token: verified, bound, spent once
    build_input,  # ctx -> policy input document
    decide,  # one policy query -> Decision (fail closed)
    hold_for_approval,  # require_approval -> held for a person (202)
    admit,  # rate, quota, concurrency slot, clamped limits
    dispatch,  # spec -> fresh sandbox -> result
    review,  # what the code tried -> the policy's review -> flags; the result stored
)

# Which terminal audit record type an error produces.
_TERMINAL_TYPES = {
    errors.UNAUTHENTICATED.code: "auth.failed",
    errors.FORBIDDEN.code: "auth.failed",
    errors.RATE_LIMITED.code: "rate.limited",
    errors.QUOTA_EXCEEDED.code: "rate.limited",
    errors.QUEUE_TIMEOUT.code: "rate.limited",
}


class Pipeline:
    def __init__(self, services: Services, stages: tuple[Stage, ...] = STAGES) -> None:
        self.services = services
        self.stages = stages

    async def run(self, ctx: ExecContext) -> ExecContext:
        """Run every stage in order; raises GatewayError after recording it."""
        logs.bind(ctx.request_id, ctx.execution_id)
        tracing = self.services.tracing
        span = tracing.request(ctx)
        started = time.perf_counter()
        error: GatewayError | None = None
        try:
            async with ctx.cleanup:
                for stage in self.stages:
                    with tracing.stage(stage.__name__, ctx):
                        await stage(ctx, self.services)
        except Held as held:
            ctx.held = held.approval
        except GatewayError as exc:
            error = exc
        except AuditUnavailable as exc:
            error = GatewayError(errors.AUDIT_UNAVAILABLE, f"audit log unavailable: {exc}")
        except Exception:
            log.exception("pipeline failed", extra={"request_id": ctx.request_id})
            error = GatewayError(errors.INTERNAL, "internal error", request_id=ctx.request_id)
        finally:
            ctx.bearer = None
        if ctx.held is not None:
            await self._record_held(ctx)
        if error is None and ctx.audit_pending:
            error = await self._settle(ctx)
        self.services.metrics.observe_request(
            ctx.ingress, error.code if error else "ok", time.perf_counter() - started
        )
        tracing.finish(span, ctx, error.code if error else ("held" if ctx.held else "ok"))
        if error is not None:
            await asyncio.shield(self._record_error(ctx, error))
            raise error
        return ctx

    async def _record_held(self, ctx: ExecContext) -> None:
        approval = ctx.held
        assert approval is not None
        ctx.audit_pending.append(
            self.services.audit.submit(
                "approval.requested",
                **ctx.audit_fields(),
                approval_id=approval.id,
                reasons=approval.reasons,
                code_sha256=approval.code_sha256,
                expires_at=iso(approval.expires_at),
                webhook=approval.delivery.get("status"),
            )
        )

    async def _settle(self, ctx: ExecContext) -> GatewayError | None:
        """Wait until every record this request submitted is durable."""
        self.services.audit.kick()  # what was only queued goes now
        results = await asyncio.gather(*ctx.audit_pending, return_exceptions=True)
        ctx.audit_pending.clear()
        for result in results:
            if isinstance(result, BaseException):
                return GatewayError(errors.AUDIT_UNAVAILABLE, f"audit log unavailable: {result}")
        return None

    async def _record_error(self, ctx: ExecContext, error: GatewayError) -> None:
        record_type = _TERMINAL_TYPES.get(error.code, "request.rejected")
        fields = {
            "ingress": ctx.ingress,
            "source_ip": ctx.source_ip,
            "code": error.code,
            "outcome": error.kind.outcome,
            "message": error.message,
        }
        if ctx.decision is not None:
            fields["decision_id"] = ctx.decision.decision_id
        try:
            await self.services.audit.append(record_type, **ctx.audit_fields(), **fields)
            # Submitted earlier in the chain, so durable now too; collect their outcome.
            await asyncio.gather(*ctx.audit_pending, return_exceptions=True)
        except AuditUnavailable as exc:
            # The caller still gets its error; the log's health turns readiness red.
            log.error("audit record lost for %s: %s", ctx.request_id, exc)
            if error.kind is not errors.AUDIT_UNAVAILABLE:
                raise GatewayError(errors.AUDIT_UNAVAILABLE, "audit log unavailable") from exc
