"""Per-request state: one object that every pipeline stage reads and fills in.

An ingress (REST, tool calls, MCP, proxy) creates it with what it knows of the
transport; the stages add the principal, the request, the decision and the result.
Nothing here is shared between requests.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from backends.base import ExecResult, Limits
    from gateway.approvals.records import Approval
    from gateway.approvals.tokens import ApprovalGrant
    from gateway.auth.tokens import Principal
    from gateway.models import ExecutionRequest
    from gateway.policy.decision import Decision
    from gateway.settings.model import TenantSettings


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


def utc_now() -> datetime:
    return datetime.now(UTC)


def rfc3339(ts: datetime) -> str:
    return ts.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class ExecContext:
    ingress: str  # rest | openai | anthropic | mcp | proxy
    source_ip: str
    # The bearer token as received; the authenticate stage clears it so it can
    # never reach the policy input, a log line or an audit record.
    bearer: str | None
    # The ingress's request body, undecoded, and how to turn it into a request.
    payload: bytes | Any
    decode: Callable[[ExecContext], ExecutionRequest]
    tool_name: str = "run_code"
    # A call of a non-code tool (an upstream MCP tool the policy guards): its name,
    # server and arguments, given to the policy as `tool`; None for code.
    tool_call: dict[str, Any] | None = None
    request_id: str = field(default_factory=lambda: new_id("req"))
    execution_id: str = field(default_factory=lambda: new_id("exe"))
    received_at: datetime = field(default_factory=utc_now)

    principal: Principal | None = None
    request: ExecutionRequest | None = None
    tenant: TenantSettings | None = None
    analysis: dict[str, Any] | None = None
    policy_input: dict[str, Any] | None = None
    decision: Decision | None = None
    # A presented approval token, verified and spent, and its policy-input block.
    grant: ApprovalGrant | None = None
    approval: dict[str, Any] | None = None
    # Set when policy held the request for a person: the answer is 202, not a result.
    held: Approval | None = None
    backend: str | None = None
    limits: Limits | None = None
    result: ExecResult | None = None
    # The policy's review of what the code tried: {"flags": [...], "error"?}.
    review: dict[str, Any] | None = None
    # Set by the dispatch stage once the program has been handed to a sandbox: from
    # then on the request cannot fail before it runs (a streaming answer may begin).
    running: asyncio.Event = field(default_factory=asyncio.Event)
    # Things to undo when the request ends (concurrency slots, leases).
    cleanup: AsyncExitStack = field(default_factory=AsyncExitStack)
    # Audit records submitted but not yet awaited; the pipeline waits for all of them
    # before the caller gets an answer.
    audit_pending: list[asyncio.Future[dict[str, Any]]] = field(default_factory=list)

    @property
    def tenant_id(self) -> str | None:
        return self.principal.tenant if self.principal else None

    @property
    def subject(self) -> str | None:
        return self.principal.sub if self.principal else None

    def audit_fields(self) -> dict[str, Any]:
        """The identifying fields every audit record of this request carries."""
        return {
            "request_id": self.request_id,
            "execution_id": self.execution_id,
            "tenant": self.tenant_id,
            "subject": self.subject,
        }
