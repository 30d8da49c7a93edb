"""The shared resources the pipeline stages use, gathered in one object.

Built once by the app's cleanup context (or by a test fixture) and passed to every
stage; stages never reach for globals.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from backends.base import SandboxBackend
from gateway.admission.gate import Admission
from gateway.approvals.desk import ApprovalDesk
from gateway.audit.log import AuditLog
from gateway.auth.tokens import TokenVerifier
from gateway.executions.live import LiveRegistry
from gateway.executions.store import ExecutionStore
from gateway.policy.base import PolicyEngine
from gateway.policy.inputs import DecisionInputLog
from gateway.review.notifier import ReviewNotifier
from gateway.settings.model import Settings
from gateway.telemetry.metrics import Metrics
from gateway.telemetry.tracing import Tracing


@dataclass
class Services:
    settings: Settings
    verifier: TokenVerifier
    engine: PolicyEngine
    admission: Admission
    backends: dict[str, SandboxBackend]
    audit: AuditLog
    store: ExecutionStore
    approvals: ApprovalDesk
    # Flagged executions to the review webhook (does nothing unless configured).
    reviews: ReviewNotifier | None = None
    metrics: Metrics = field(default_factory=Metrics)
    # OpenTelemetry spans per request and stage; a no-op unless [telemetry] enabled.
    tracing: Tracing = field(default_factory=Tracing)
    # Decision inputs kept for `execgate policy replay` (None: policy.record_inputs off).
    decision_inputs: DecisionInputLog | None = None
    # What running executions print, for followers (SSE, MCP progress).
    live: LiveRegistry = field(default_factory=LiveRegistry)
    # Backends the escape self-test took out of service: name -> why.
    out_of_service: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.reviews is None:
            self.reviews = ReviewNotifier(self.settings.review, self.audit)
