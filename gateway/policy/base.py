"""The policy engine interface: one decision document per request, or an error.

Engines return the raw `data.execgate.decision` object; `gateway.decision` turns
it into a `Decision` and rejects anything malformed. Every failure is a
`PolicyEngineError`, and the gateway fails closed on every one of them.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol, runtime_checkable

ErrorKindName = Literal["unavailable", "invalid"]

DECISION_PATH = "execgate/decision"  # data.execgate.decision


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


@runtime_checkable
class PolicyEngine(Protocol):
    # Content hash of the loaded policy files and data; recorded with every decision.
    revision: str

    async def start(self) -> None:
        """Load and compile the policy; raise PolicyEngineError if it is unusable."""
        ...

    async def decide(self, input: dict[str, Any]) -> dict[str, Any]:
        """The raw decision object for `input`, or PolicyEngineError."""
        ...

    async def health(self) -> tuple[bool, str]:
        """(answers, human-readable detail) for /readyz."""
        ...

    async def close(self) -> None: ...
