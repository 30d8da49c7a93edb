"""`execgate policy replay` and `policy eval`: a candidate policy over real inputs.

Replay evaluates a candidate policy directory, with the embedded engine, on the
decision inputs the gateway kept (policy/inputs.py) and, where OPA decided, on OPA's
decision-log entries, and sets each new decision beside the one that was made:

- newly_denied: allowed or held before, denied now;
- newly_allowed: denied before, allowed now (with or without a person);
- approval_added / approval_dropped: allowed outright <-> held for a person;
- obligations_changed: the same verdict with other limits, egress or backend;
- candidate_errors: the candidate gave no valid decision (it would fail closed).

It fails (exit 1) when the candidate allows anything that was denied, or cannot
decide an input: a gate for policy pull requests.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.policy.base import PolicyEngine, PolicyEngineError
from gateway.policy.decision import DecisionError, parse_decision
from gateway.policy.inputs import KeptDecision, summary

EXAMPLES = 5
CATEGORIES = (
    "newly_denied",
    "newly_allowed",
    "approval_added",
    "approval_dropped",
    "obligations_changed",
    "candidate_errors",
)
# What a change in these categories means for the exit status.
FAILING = ("newly_allowed", "candidate_errors")


def verdict(decided: dict[str, Any]) -> str:
    if decided["deny"] or not (decided["allow"] or decided["require_approval"]):
        return "deny"
    return "hold" if decided["require_approval"] else "allow"


def _changed_obligations(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    keys = sorted(set(old) | set(new))
    return [k for k in keys if old.get(k) != new.get(k)]


@dataclass
class Change:
    decision_id: str
    tenant: str | None
    before: str
    after: str
    detail: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "decision_id": self.decision_id,
            "tenant": self.tenant,
            "before": self.before,
            "after": self.after,
            "detail": self.detail,
        }


@dataclass
class Report:
    candidate: str
    revision: str
    evaluated: int = 0
    unchanged: int = 0
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    examples: dict[str, list[Change]] = field(default_factory=lambda: {c: [] for c in CATEGORIES})

    def add(self, category: str, change: Change) -> None:
        self.counts[category] += 1
        if len(self.examples[category]) < EXAMPLES:
            self.examples[category].append(change)

    @property
    def failed(self) -> bool:
        return any(self.counts[c] for c in FAILING)

    def as_dict(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate,
            "revision": self.revision,
            "evaluated": self.evaluated,
            "unchanged": self.unchanged,
            "counts": self.counts,
            "examples": {c: [x.as_dict() for x in xs] for c, xs in self.examples.items()},
            "failed": self.failed,
        }

    def render(self) -> str:
        lines = [
            f"candidate {self.candidate} (revision {self.revision[:12] or 'unknown'}): "
            f"{self.evaluated} recorded decisions replayed, {self.unchanged} unchanged",
        ]
        for category in CATEGORIES:
            count = self.counts[category]
            mark = "  FAIL" if count and category in FAILING else ""
            lines.append(f"  {category:<20} {count:>7}{mark}")
            for ex in self.examples[category]:
                detail = f" ({'; '.join(ex.detail)})" if ex.detail else ""
                lines.append(
                    f"      {ex.decision_id}  tenant={ex.tenant}  {ex.before} -> {ex.after}{detail}"
                )
        lines.append(
            "result: FAIL (the candidate allows what was denied, or cannot decide)"
            if self.failed
            else "result: ok"
        )
        return "\n".join(lines)


def decided_summary(value: Any, decision_id: str, revision: str) -> dict[str, Any]:
    decision = parse_decision(value, decision_id=decision_id, revision=revision)
    return summary(
        decision.allow,
        list(decision.deny),
        decision.require_approval,
        decision.obligations.as_dict(),
    )


async def evaluate(engine: PolicyEngine, input: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The candidate's decision on one input: (summary, the raw document)."""
    answer = await engine.decide(input)
    return decided_summary(answer.value, "replay", answer.revision), answer.value


def compare(report: Report, kept: KeptDecision, after: dict[str, Any] | None, error: str) -> None:
    report.evaluated += 1
    before_verdict = verdict(kept.decided)
    if after is None:
        report.add(
            "candidate_errors",
            Change(kept.decision_id, kept.tenant, before_verdict, "error", [error]),
        )
        return
    after_verdict = verdict(after)
    change = Change(kept.decision_id, kept.tenant, before_verdict, after_verdict)
    if before_verdict != after_verdict:
        if after_verdict == "deny":
            change.detail = list(after["deny"])[:3]
            report.add("newly_denied", change)
        elif before_verdict == "deny":
            report.add("newly_allowed", change)
        elif after_verdict == "hold":
            report.add("approval_added", change)
        else:
            report.add("approval_dropped", change)
        return
    changed = _changed_obligations(kept.decided["obligations"], after["obligations"])
    if changed and after_verdict != "deny":
        change.detail = [
            f"{k}: {kept.decided['obligations'].get(k)!r} -> {after['obligations'].get(k)!r}"
            for k in changed
        ]
        report.add("obligations_changed", change)
        return
    report.unchanged += 1


async def replay(engine: PolicyEngine, kept: Iterable[KeptDecision], report: Report) -> Report:
    for entry in kept:
        try:
            after, _ = await evaluate(engine, entry.input)
        except (PolicyEngineError, DecisionError) as exc:
            compare(report, entry, None, str(exc))
            continue
        compare(report, entry, after, "")
    return report


def opa_decision_log(path: Path, tenant: str | None = None) -> Iterator[KeptDecision]:
    """Entries of OPA's decision log (its console logger's JSON lines, as
    deploy/opa/config.yaml writes them) for `data.execgate.decision`."""
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            if not isinstance(entry, dict) or entry.get("path") not in (
                "execgate/decision",
                "data.execgate.decision",
            ):
                continue
            data_input = entry.get("input")
            if not isinstance(data_input, dict) or "result" not in entry:
                continue
            decision_id = str(entry.get("decision_id", ""))
            try:
                decided = decided_summary(entry["result"], decision_id, "")
            except DecisionError:
                continue
            entry_tenant = (data_input.get("tenant") or {}).get("id")
            if tenant is not None and entry_tenant != tenant:
                continue
            yield KeptDecision(
                ts=0.0,
                decision_id=decision_id,
                execution_id=None,
                tenant=entry_tenant,
                engine="opa",
                revision=None,
                input=data_input,
                decided=decided,
            )


def render_decision(value: Any, revision: str) -> str:
    """One decision as `policy eval` prints it: the verdict first, then why."""
    decision = parse_decision(value, decision_id="eval", revision=revision)
    decided = summary(
        decision.allow,
        list(decision.deny),
        decision.require_approval,
        decision.obligations.as_dict(),
    )
    lines = [f"decision: {verdict(decided)}   (policy revision {revision[:12] or 'unknown'})"]
    lines += [f"  deny: {reason}" for reason in decided["deny"]]
    if decision.require_approval:
        lines.append(f"  approval required: {decision.approval_reason}")
    lines += [f"  obligation {k} = {json.dumps(v)}" for k, v in decided["obligations"].items()]
    lines += [f"  monitor: {note}" for note in decision.monitor]
    return "\n".join(lines)
