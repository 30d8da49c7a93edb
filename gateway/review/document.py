"""The review input document and the flags the policy answers with."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from backends.base import ExecResult

REVIEW_VERSION = "execgate.review/v1"
SEVERITIES = ("high", "medium", "low")
MAX_FLAGS = 64
MAX_TEXT = 300


@dataclass(frozen=True, slots=True)
class Flag:
    rule: str
    severity: str  # high, medium or low
    detail: str

    def as_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "severity": self.severity, "detail": self.detail}


def review_input(
    execution_id: str, language: str, backend: str, sub: str, tenant: str, result: ExecResult
) -> dict[str, Any]:
    """What the policy reviews: no code, no output, no token; the record as the
    result shows it."""
    behaviour = result.behaviour
    return {
        "version": REVIEW_VERSION,
        "execution": {
            "id": execution_id,
            "language": language,
            "backend": backend,
            "status": result.status.value,
            "exit_code": result.exit_code,
        },
        "subject": {"sub": sub, "tenant": tenant},
        "behaviour": behaviour.as_dict() if behaviour is not None else {"capture": "off"},
        "network": [dataclasses.asdict(a) for a in result.network],
        "events": [{"kind": e.kind, "detail": e.detail} for e in result.events],
    }


def worth_review(result: ExecResult) -> bool:
    """Whether there is anything to ask about (a plain print(1) is not)."""
    behaviour = result.behaviour
    tried = behaviour is not None and (not behaviour.empty or behaviour.dropped > 0)
    return tried or bool(result.network) or bool(result.events)


def _text(value: Any) -> str:
    text = value if isinstance(value, str) else str(value)
    return text if len(text) <= MAX_TEXT else text[: MAX_TEXT - 1] + "…"


def parse_flags(answer: dict[str, Any] | None) -> tuple[list[Flag], str]:
    """(flags, problem): the review's `flags`, high first; what could not be read is
    named in `problem` rather than dropped silently."""
    if answer is None:
        return [], ""
    raw = answer.get("flags", [])
    if not isinstance(raw, list):
        return [], "data.execgate.review.flags is not an array"
    flags, problem = [], ""
    for item in raw:
        if not isinstance(item, dict) or not isinstance(item.get("rule"), str):
            problem = "a review flag is not an object with a string rule"
            continue
        severity = item.get("severity")
        if severity not in SEVERITIES:
            severity = "medium"
        flags.append(Flag(_text(item["rule"]), str(severity), _text(item.get("detail", ""))))
    # The engines order strings differently (rego-cpp by their JSON-escaped text):
    # the gateway's order is the one shown.
    flags.sort(key=lambda f: (SEVERITIES.index(f.severity), f.rule, f.detail))
    if len(flags) > MAX_FLAGS:
        problem = f"{len(flags) - MAX_FLAGS} flags beyond {MAX_FLAGS} dropped"
        flags = flags[:MAX_FLAGS]
    return flags, problem
