"""review: what the code tried -> the policy's second question -> flags, recorded,
and the result stored.

The code has already run, so nothing here can fail the request: a review the
engine could not answer is recorded (`execution.review` with `error`) and the
result says so. Records are durable before the response, like every other.
"""

from __future__ import annotations

import asyncio
import time

from gateway.context import ExecContext
from gateway.executions.results import render_result
from gateway.policy.base import PolicyEngineError
from gateway.review.document import parse_flags, review_input, worth_review
from gateway.services import Services


async def review(ctx: ExecContext, svc: Services) -> None:
    result = ctx.result
    assert result is not None and ctx.request is not None and ctx.principal is not None
    behaviour = result.behaviour
    svc.metrics.observe_behaviour(ctx.backend or "", behaviour)
    fields = {**ctx.audit_fields(), "backend": ctx.backend}
    records = []
    if behaviour is not None and behaviour.capture == "on" and not behaviour.empty:
        records.append(svc.audit.queue("execution.behaviour", **fields, **behaviour.as_dict()))
    if svc.settings.review.enabled and worth_review(result):
        doc = review_input(
            ctx.execution_id, ctx.request.language, ctx.backend or "", ctx.principal.sub,
            ctx.principal.tenant, result,
        )  # fmt: skip
        started = time.perf_counter()
        try:
            answer = await svc.engine.review(doc)
        except PolicyEngineError as exc:
            ctx.review = {"flags": [], "error": f"{exc.kind}: {exc.message}"}
            svc.metrics.observe_review("error", time.perf_counter() - started)
        else:
            flags, problem = parse_flags(answer)
            ctx.review = {"flags": [f.as_dict() for f in flags]}
            if problem:
                ctx.review["error"] = f"invalid: {problem}"
            if answer is None:
                ctx.review["error"] = "the policy defines no data.execgate.review"
            svc.metrics.observe_review(
                "flagged" if flags else "clean", time.perf_counter() - started
            )
            for flag in flags:
                svc.metrics.flagged(flag.rule, flag.severity)
            if flags and svc.reviews is not None:
                await svc.reviews.notify(
                    ctx.execution_id, ctx.principal.tenant, ctx.backend or "", flags
                )
        records.append(svc.audit.queue("execution.review", **fields, **ctx.review))
    # The execution's own records (queued by dispatch) with these: all durable before
    # the result is stored for anyone to read, in one batch. Queued, not submitted: a
    # submitted record wakes the writer, and one made after an await (the engine's review
    # on the OPA server, the notify) missed that batch: a third fsync.
    svc.audit.kick()
    await asyncio.gather(*records, *ctx.audit_pending)
    svc.store.finished(ctx.execution_id, render_result(ctx))
