"""The suite's results as a table, as JSON, and as one summary line."""

from __future__ import annotations

from typing import Any

from gateway.escape.runner import Finding, SuiteResult
from gateway.escape.technique import Outcome


def summary(result: SuiteResult) -> str:
    verdict = "sound" if result.sound else "NOT SOUND: " + "; ".join(result.problems)
    return (
        f"escape-test {result.backend}: {len(result.findings)} techniques, "
        f"{result.count(Outcome.CONTAINED)} contained, {result.count(Outcome.ESCAPED)} escaped, "
        f"{result.count(Outcome.NOT_APPLICABLE)} not applicable, "
        f"{result.count(Outcome.ERROR)} errors, {recorded(result)} recorded"
        f" ({result.duration_ms / 1000:.1f} s): {verdict}"
    )


def recorded(result: SuiteResult) -> int:
    """Techniques whose attempt shows in their execution's behaviour record."""
    return sum(1 for f in result.findings if f.recorded)


def row(finding: Finding) -> str:
    t, v = finding.technique, finding.verdict
    detail = " ".join(v.detail.split())[:90]
    return f"{t.id:<32} {t.tries[:46]:<46} {v.outcome.value:<14} {detail}"


def table(result: SuiteResult) -> str:
    header = f"{'technique':<32} {'what was tried':<46} {'outcome':<14} detail"
    return "\n".join([header, *(row(f) for f in result.findings), summary(result)])


def as_json(result: SuiteResult) -> dict[str, Any]:
    return {
        "backend": result.backend,
        "duration_ms": result.duration_ms,
        "counts": {o.value: result.count(o) for o in Outcome},
        "sound": result.sound,
        "problems": result.problems,
        "max_not_applicable": result.max_not_applicable,
        "recorded": recorded(result),
        "techniques": [
            {
                "id": f.technique.id,
                "category": f.technique.category,
                "tries": f.technique.tries,
                "outcome": f.verdict.outcome.value,
                "detail": f.verdict.detail,
                "duration_ms": f.duration_ms,
                "recorded": f.recorded,
                "record_kinds": sorted(f.seen),
            }
            for f in result.findings
        ],
    }
