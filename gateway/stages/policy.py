"""decide: one policy query per request; anything but a clear answer fails closed.

The decision id is the engine's own when it has one (OPA's decision-log
`decision_id`), so the gateway's audit log and OPA's decision log join on one
value; otherwise (embedded engine, or no answer at all) it is ours, `dec_...`.
"""

from __future__ import annotations

import time

from gateway import errors
from gateway.context import ExecContext, new_id
from gateway.errors import GatewayError
from gateway.policy.base import PolicyEngineError
from gateway.policy.decision import DecisionError, parse_decision
from gateway.policy.inputs import summary
from gateway.services import Services


async def decide(ctx: ExecContext, svc: Services) -> None:
    assert ctx.policy_input is not None
    engine = svc.engine
    decision_id = new_id("dec")
    started = time.perf_counter()
    try:
        answer = await engine.decide(ctx.policy_input)
        decision_id = answer.engine_decision_id or decision_id
        decision = parse_decision(answer.value, decision_id=decision_id, revision=answer.revision)
    except PolicyEngineError as exc:
        svc.metrics.observe_decision("error", time.perf_counter() - started)
        kind = errors.POLICY_INVALID if exc.kind == "invalid" else errors.POLICY_UNAVAILABLE
        raise GatewayError(kind, f"no policy decision: {exc}", decision_id=decision_id) from None
    except DecisionError as exc:
        svc.metrics.observe_decision("invalid", time.perf_counter() - started)
        raise GatewayError(
            errors.POLICY_INVALID, f"policy decision rejected: {exc}", decision_id=decision_id
        ) from None
    ctx.decision = decision
    if svc.decision_inputs is not None:
        # Queued only: masked and written off the request path.
        svc.decision_inputs.record(
            decision_id,
            ctx.execution_id,
            ctx.policy_input,
            summary(
                decision.allow,
                list(decision.deny),
                decision.require_approval,
                decision.obligations.as_dict(),
            ),
            decision.revision,
        )
    outcome = (
        "allow"
        if decision.allow
        else ("approval" if decision.require_approval and not decision.deny else "deny")
    )
    svc.metrics.observe_decision(outcome, time.perf_counter() - started)
    # Not awaited here, nor written alone: the next record that is awaited
    # (execution.started, approval.requested or the terminal error record) comes
    # after it in the chain and takes it along, one fsync for both.
    ctx.audit_pending.append(
        svc.audit.queue(
            "policy.decided",
            **ctx.audit_fields(),
            decision_id=decision_id,
            ingress=ctx.ingress,
            tool_name=ctx.tool_name,
            policy_revision=decision.revision,
            allow=decision.allow,
            deny=list(decision.deny),
            require_approval=decision.require_approval,
            obligations=decision.obligations.as_dict(),
            monitor=list(decision.monitor),
            code_sha256=ctx.policy_input["execution"]["code_sha256"],
            language=ctx.policy_input["execution"]["language"],
            analysis=ctx.policy_input["analysis"],
        )
    )
    if decision.deny or not (decision.allow or decision.require_approval):
        raise GatewayError(
            errors.POLICY_DENIED,
            "denied by policy",
            reasons=list(decision.deny) or ["policy did not allow this execution"],
            decision_id=decision_id,
        )
