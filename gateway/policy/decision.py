"""The policy decision as the gateway understands it, parsed so that it fails closed.

`parse_decision` accepts exactly the shape of SPEC section 4 and raises
`DecisionError` for anything it cannot act on with certainty. Unknown top-level
keys are ignored (a policy may add its own annotations), but an unknown
obligation is an error: the gateway must never run code under an obligation it
does not understand. Contradictions resolve towards not running:
- `allow: true` with a non-empty `deny` is a denial;
- `allow: true` with `require_approval: true` is a hold for approval.
`deny` and `monitor` are sets of reasons: the gateway sorts them (by code
point), so their order never depends on the engine (rego-cpp orders strings by
their JSON-escaped text, OPA by their characters).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


class DecisionError(ValueError):
    """The engine's answer is not a decision the gateway can act on."""


@dataclass(frozen=True, slots=True)
class Obligations:
    backend: str | None = None
    timeout_s: float | None = None
    memory_mb: int | None = None
    cpus: float | None = None
    pids: int | None = None
    disk_mb: int | None = None
    output_bytes: int | None = None
    # None: the policy said nothing (no network); () : explicitly none.
    egress: tuple[str, ...] | None = None

    def as_dict(self) -> dict[str, Any]:
        """The obligations that were set, JSON-ready (egress as a list)."""
        out: dict[str, Any] = {}
        for name in _OBLIGATION_KEYS:
            value = getattr(self, name)
            if value is not None:
                out[name] = list(value) if name == "egress" else value
        return out

    def limits(self) -> dict[str, float | int]:
        """Just the resource limits that were set."""
        return {k: getattr(self, k) for k in _LIMIT_TYPES if getattr(self, k) is not None}


@dataclass(frozen=True, slots=True)
class Decision:
    allow: bool
    deny: tuple[str, ...]
    require_approval: bool
    approval_reason: str
    approval_ttl_s: int | None
    obligations: Obligations
    monitor: tuple[str, ...]
    decision_id: str
    revision: str
    # Top-level keys the gateway does not know; kept for the audit record.
    extra_keys: tuple[str, ...] = field(default=())


# Limits: real numbers (seconds, CPUs) or whole numbers (counts, sizes).
_LIMIT_TYPES: dict[str, type] = {
    "timeout_s": float,
    "memory_mb": int,
    "cpus": float,
    "pids": int,
    "disk_mb": int,
    "output_bytes": int,
}
_OBLIGATION_KEYS = ("backend", *_LIMIT_TYPES, "egress")
_KNOWN_KEYS = {"allow", "deny", "require_approval", "approval", "obligations", "monitor"}


def parse_decision(raw: Any, *, decision_id: str, revision: str) -> Decision:
    if not isinstance(raw, dict):
        raise DecisionError(f"decision must be an object, got {_kind(raw)}")
    if "allow" not in raw:
        raise DecisionError("decision has no 'allow'")
    allow = _bool(raw["allow"], "allow")
    deny = tuple(sorted(_strings(raw.get("deny", []), "deny")))
    require_approval = _bool(raw.get("require_approval", False), "require_approval")
    approval_reason, approval_ttl_s = _approval(raw.get("approval"), require_approval)
    return Decision(
        allow=allow and not deny and not require_approval,
        deny=deny,
        require_approval=require_approval,
        approval_reason=approval_reason,
        approval_ttl_s=approval_ttl_s,
        obligations=_obligations(raw.get("obligations", {})),
        monitor=tuple(sorted(_strings(raw.get("monitor", []), "monitor"))),
        decision_id=decision_id,
        revision=revision,
        extra_keys=tuple(sorted(str(k) for k in raw if k not in _KNOWN_KEYS)),
    )


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "a boolean", str: "a string", list: "an array", dict: "an object"}.get(
        type(value), "a number" if isinstance(value, int | float) else type(value).__name__
    )


def _bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise DecisionError(f"'{name}' must be a boolean, got {_kind(value)}")
    return value


def _strings(value: Any, name: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise DecisionError(f"'{name}' must be an array of strings, got {_kind(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise DecisionError(f"'{name}[{i}]' must be a string, got {_kind(item)}")
    return tuple(value)


def _approval(value: Any, required: bool) -> tuple[str, int | None]:
    if value is None:
        return "", None
    if not isinstance(value, dict):
        raise DecisionError(f"'approval' must be an object, got {_kind(value)}")
    reason = value.get("reason", "")
    if not isinstance(reason, str):
        raise DecisionError(f"'approval.reason' must be a string, got {_kind(reason)}")
    ttl = value.get("ttl_s")
    if ttl is not None:
        ttl = _whole(ttl, "approval.ttl_s")
    return (reason, ttl) if required else ("", None)


def _obligations(value: Any) -> Obligations:
    if not isinstance(value, dict):
        raise DecisionError(f"'obligations' must be an object, got {_kind(value)}")
    unknown = sorted(str(k) for k in value if k not in _OBLIGATION_KEYS)
    if unknown:
        raise DecisionError(f"unknown obligation(s): {', '.join(unknown)}")
    parsed: dict[str, Any] = {}
    for name, raw in value.items():
        if name == "backend":
            if not isinstance(raw, str) or not raw:
                raise DecisionError(f"'obligations.backend' must be a name, got {_kind(raw)}")
            parsed[name] = raw
        elif name == "egress":
            parsed[name] = _strings(raw, "obligations.egress")
        elif _LIMIT_TYPES[name] is int:
            parsed[name] = _whole(raw, f"obligations.{name}")
        else:
            parsed[name] = _positive(raw, f"obligations.{name}")
    return Obligations(**parsed)


def _positive(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DecisionError(f"'{name}' must be a number, got {_kind(value)}")
    if not math.isfinite(value) or value <= 0:
        raise DecisionError(f"'{name}' must be positive, got {value}")
    return value


def _whole(value: Any, name: str) -> int:
    number = _positive(value, name)
    if number != int(number):
        raise DecisionError(f"'{name}' must be a whole number, got {value}")
    return int(number)
