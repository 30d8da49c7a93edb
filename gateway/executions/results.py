"""An execution's result as the API shows it (SPEC section 3.1)."""

from __future__ import annotations

import base64
import dataclasses
from typing import Any

from backends.capture.record import capture_off
from gateway.approvals.records import iso
from gateway.context import ExecContext


def _text(data: bytes) -> str:
    # Output is arbitrary bytes; invalid UTF-8 is replaced, never an error.
    return data.decode("utf-8", errors="replace")


def render_result(ctx: ExecContext) -> dict[str, Any]:
    result, limits, decision = ctx.result, ctx.limits, ctx.decision
    assert result is not None and limits is not None and decision is not None
    return {
        "execution_id": ctx.execution_id,
        "status": result.status.value,
        "exit_code": result.exit_code,
        "stdout": _text(result.stdout),
        "stderr": _text(result.stderr),
        "truncated": {"stdout": result.truncated_stdout, "stderr": result.truncated_stderr},
        "duration_ms": result.duration_ms,
        "usage": {"cpu_ms": result.usage.cpu_ms, "max_rss_kb": result.usage.max_rss_kb},
        "limits": limits.as_dict(),
        "files": [
            {"path": f.path, "size": f.size, "content_b64": base64.b64encode(f.content).decode()}
            for f in result.files
        ],
        "network": [dataclasses.asdict(a) for a in result.network],
        "behaviour": render_behaviour(ctx),
        "events": [{"kind": e.kind, "detail": e.detail} for e in result.events],
        "backend": ctx.backend,
        "decision_id": decision.decision_id,
        "monitor": list(decision.monitor),
    }


def render_behaviour(ctx: ExecContext) -> dict[str, Any]:
    """The result's `behaviour` section: what the code tried beyond the network, and
    what the review flagged (never absent: `capture: off` says why there is none)."""
    result = ctx.result
    assert result is not None
    behaviour = result.behaviour
    section = (
        behaviour.as_dict()
        if behaviour is not None
        else capture_off(f"backend {ctx.backend} records no behaviour").as_dict()
    )
    review = ctx.review or {}
    section["flags"] = review.get("flags", [])
    if "error" in review:
        section["review_error"] = review["error"]
    return section


def held_body(ctx: ExecContext) -> dict[str, object]:
    """What a held request answers (202, SSE `held`, tool replies)."""
    approval = ctx.held
    assert approval is not None
    return {
        "status": "pending_approval",
        "approval_id": approval.id,
        "execution_id": ctx.execution_id,
        "expires_at": iso(approval.expires_at),
        "reasons": approval.reasons,
    }
