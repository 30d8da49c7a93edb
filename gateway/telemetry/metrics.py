"""Prometheus metrics, in base units with the `execgate_` prefix.

Each gateway owns its own registry (no process-wide default), so tests and
several apps in one process never share counters.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, exposition, generate_latest

from backends.capture.record import Behaviour

CONTENT_TYPE = exposition.CONTENT_TYPE_LATEST

_FAST = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
MAX_RULE_LABELS = 64
_SLOW = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "execgate_requests_total",
            "Pipeline requests by ingress and outcome code",
            ["ingress", "code"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "execgate_request_duration_seconds",
            "Whole pipeline duration",
            ["ingress"],
            buckets=_SLOW,
            registry=r,
        )
        self.decisions = Counter(
            "execgate_policy_decisions_total",
            "Policy decisions by outcome",
            ["outcome"],
            registry=r,
        )
        self.decision_seconds = Histogram(
            "execgate_policy_decision_duration_seconds",
            "Policy query latency",
            buckets=_FAST,
            registry=r,
        )
        self.executions = Counter(
            "execgate_executions_total",
            "Sandbox executions by backend and status",
            ["backend", "status"],
            registry=r,
        )
        self.execution_seconds = Histogram(
            "execgate_execution_duration_seconds",
            "Sandbox run duration",
            ["backend"],
            buckets=_SLOW,
            registry=r,
        )
        self.limited = Counter(
            "execgate_rate_limited_total",
            "Requests refused by admission",
            ["tenant", "code"],
            registry=r,
        )
        # Per-tenant (label bounded by configuration: gateway/admission/gate.py tenant_label).
        self.tenant_admitted = Counter(
            "execgate_tenant_admitted_total",
            "Requests admitted (rate, quota, slot) by tenant",
            ["tenant"],
            registry=r,
        )
        self.tenant_executed = Counter(
            "execgate_tenant_executions_total",
            "Executions that ran, by tenant and status",
            ["tenant", "status"],
            registry=r,
        )
        self._behaviour_metrics(r)

    def _behaviour_metrics(self, r: CollectorRegistry) -> None:
        self.attempts = Counter(
            "execgate_behaviour_attempts_total",
            "What sandboxed code tried beyond the network, by kind and verdict",
            ["kind", "verdict"],
            registry=r,
        )
        self.capture_off = Counter(
            "execgate_behaviour_capture_off_total",
            "Executions whose backend recorded no behaviour",
            ["backend"],
            registry=r,
        )
        self.reviews = Counter(
            "execgate_reviews_total",
            "Policy reviews of finished executions by outcome (clean, flagged, error)",
            ["outcome"],
            registry=r,
        )
        self.review_seconds = Histogram(
            "execgate_review_duration_seconds", "Policy review latency", buckets=_FAST, registry=r
        )
        self.flags = Counter(
            "execgate_review_flags_total", "Review flags by rule and severity",
            ["rule", "severity"], registry=r,
        )  # fmt: skip
        self._rules: set[str] = set()

    def observe_behaviour(self, backend: str, behaviour: Behaviour | None) -> None:
        if behaviour is None or behaviour.capture != "on":
            self.capture_off.labels(backend).inc()
            return
        for kind, entries in (
            ("file", behaviour.files), ("program", behaviour.programs),
            ("signal", behaviour.signals),
        ):  # fmt: skip
            for entry in entries:
                verdict = "ok" if entry.result == "ok" else "failed"
                self.attempts.labels(kind, verdict).inc(entry.count)
        for _name, count in behaviour.syscalls_refused:
            self.attempts.labels("syscall", "refused").inc(count)
        if behaviour.dropped:
            self.attempts.labels("any", "dropped").inc(behaviour.dropped)

    def observe_review(self, outcome: str, seconds: float) -> None:
        self.reviews.labels(outcome).inc()
        self.review_seconds.observe(seconds)

    def flagged(self, rule: str, severity: str) -> None:
        # Rule names come from the policy; past MAX_RULE_LABELS distinct ones (a rule
        # that puts a path in its name), the rest count as "other".
        if rule not in self._rules and len(self._rules) < MAX_RULE_LABELS:
            self._rules.add(rule[:64])
        self.flags.labels(rule[:64] if rule[:64] in self._rules else "other", severity).inc()

    def observe_request(self, ingress: str, code: str, seconds: float) -> None:
        self.requests.labels(ingress, code).inc()
        self.request_seconds.labels(ingress).observe(seconds)

    def observe_decision(self, outcome: str, seconds: float) -> None:
        self.decisions.labels(outcome).inc()
        self.decision_seconds.observe(seconds)

    def observe_execution(self, backend: str, status: str, seconds: float) -> None:
        self.executions.labels(backend, status).inc()
        self.execution_seconds.labels(backend).observe(seconds)

    def rate_limited(self, tenant: str, code: str) -> None:
        self.limited.labels(tenant, code).inc()

    def admitted(self, tenant: str) -> None:
        self.tenant_admitted.labels(tenant).inc()

    def executed(self, tenant: str, status: str) -> None:
        self.tenant_executed.labels(tenant, status).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
