"""The policy engine interface: one decision document per request, or an error.

Engines return the raw `data.execgate.decision` object in an `EngineAnswer`
together with the policy revision that produced it (policies reload while the
gateway runs, so the engine's current revision may already be another one) and,
for OPA, OPA's own decision id. `gateway.decision` turns the object into a
`Decision` and rejects anything malformed. Every failure is a
`PolicyEngineError`, and the gateway fails closed on every one of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

ErrorKindName = Literal["unavailable", "invalid"]

DECISION_PATH = "execgate/decision"  # data.execgate.decision
# The second question, asked after an execution over what it tried (optional).
REVIEW_PATH = "execgate/review"  # data.execgate.review
# What a decision-log entry leaves out (optional; policies/system/log.rego).
MASK_PATH = "system/log/mask"  # data.system.log.mask


class PolicyEngineError(Exception):
    """No decision.

    `kind` is "unavailable" when the engine could not answer (down, timed out,
    overloaded) and "invalid" when it answered something unusable (a policy that
    does not compile, an undefined or non-object decision, an evaluation error).
    """

    def __init__(self, kind: ErrorKindName, message: str) -> None:
        super().__init__(message)
        self.kind: ErrorKindName = kind
        self.message = message


@dataclass(frozen=True, slots=True)
class EngineAnswer:
    # The decision document as the engine produced it (an object; checked by the engine).
    value: dict[str, Any]
    # Content hash of the policy files and data that decided.
    revision: str
    # The engine's own id for this decision (OPA's decision log `decision_id`), if any.
    engine_decision_id: str | None = None


@runtime_checkable
class PolicyEngine(Protocol):
    # Content hash of the policy currently loaded (the latest one seen, for OPA).
    revision: str

    async def start(self) -> None:
        """Load and compile the policy; raise PolicyEngineError if it is unusable."""
        ...

    async def decide(self, input: dict[str, Any]) -> EngineAnswer:
        """The raw decision object for `input` and who decided, or PolicyEngineError."""
        ...

    async def review(self, input: dict[str, Any]) -> dict[str, Any] | None:
        """`data.execgate.review` for a finished execution's behaviour; None when the
        loaded policy defines no review. PolicyEngineError as for decide()."""
        ...

    async def health(self) -> tuple[bool, str]:
        """(answers, human-readable detail) for /readyz."""
        ...

    async def close(self) -> None: ...


@runtime_checkable
class LogMasker(Protocol):
    """An engine that can also answer `data.system.log.mask` in-process, cheaply,
    from any thread (the decision-input log's writer asks it, off the event loop)."""

    def mask_pointers(self, entry: dict[str, Any]) -> list[str] | None:
        """The JSON pointers to erase from a decision-log entry; None: not answered
        here (the log's own evaluator decides, and reports what is wrong)."""
        ...


def json_kind(value: Any) -> str:
    """ "a string", "an array", ...: how error messages name a JSON value's type."""
    if isinstance(value, bool):
        return "a boolean"
    names = {str: "a string", list: "an array", dict: "an object", type(None): "null"}
    return names.get(type(value), "a number" if isinstance(value, int | float) else "unknown")
