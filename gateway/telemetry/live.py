"""Metrics read from the running gateway rather than counted in the pipeline: sandbox
pools per backend, audit log writes (latency, records by type, health) and webhook
deliveries (counted from the `approval.delivered` records as they become durable).

`install` hangs them on the gateway's own registry (gateway/telemetry/metrics.py): gauges are
read at scrape time by a collector, so nothing has to remember to update them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from backends.attempts import STAGES
from gateway.services import Services

# fsync latency spans SSDs (~0.1 ms) to networked disks (tens of ms).
_WRITE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class LiveCollector(Collector):
    """Gauges read from the services at scrape time."""

    def __init__(self, services: Services) -> None:
        self.services = services

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        ready = GaugeMetricFamily(
            "execgate_sandbox_pool_ready", "Sandboxes made ahead, waiting", labels=["backend"]
        )
        running = GaugeMetricFamily(
            "execgate_sandboxes_running", "Sandboxes running an execution", labels=["backend"]
        )
        out = GaugeMetricFamily(
            "execgate_backend_out_of_service",
            "1 when the escape self-test took the backend out of service",
            labels=["backend"],
        )
        for name, backend in self.services.backends.items():
            # Properties of the pooled backends (nsjail, docker, docker-gvisor).
            if hasattr(backend, "ready_sandboxes"):
                ready.add_metric([name], len(backend.ready_sandboxes))
            if hasattr(backend, "running_sandboxes"):
                running.add_metric([name], len(backend.running_sandboxes))
            out.add_metric([name], 1.0 if name in self.services.out_of_service else 0.0)
        failures = CounterMetricFamily(
            "execgate_sandbox_start_failures",
            "Sandboxes that failed before the program was handed over (replaced by a"
            " fresh one), by backend and stage",
            labels=["backend", "stage"],
        )
        for name, backend in self.services.backends.items():
            counts = getattr(getattr(backend, "start_failures", None), "counts", {})
            for stage in STAGES:
                failures.add_metric([name, stage], counts.get(stage, 0))
        healthy = GaugeMetricFamily(
            "execgate_audit_healthy", "1 while the audit log accepts records (else: refusing)"
        )
        healthy.add_metric([], 1.0 if self.services.audit.healthy else 0.0)
        yield from (ready, running, out, failures, healthy)

    def describe(self) -> Iterable[Any]:
        return []


class AuditObserver:
    """Counts what the audit log made durable, and how long each write took."""

    def __init__(self, services: Services) -> None:
        registry = services.metrics.registry
        self.write_seconds = Histogram(
            "execgate_audit_write_duration_seconds",
            "One audit batch: write plus fsync",
            buckets=_WRITE_BUCKETS,
            registry=registry,
        )
        self.records = Counter(
            "execgate_audit_records_total", "Durable audit records by type", ["type"],
            registry=registry,
        )  # fmt: skip
        self.deliveries = Counter(
            "execgate_webhook_deliveries_total",
            "Approval webhook delivery attempts by outcome (delivered, retrying, failed)",
            ["outcome"],
            registry=registry,
        )

    def __call__(self, records: list[dict[str, Any]], seconds: float) -> None:
        self.write_seconds.observe(seconds)
        for record in records:
            self.records.labels(record["type"]).inc()
            if record["type"] == "approval.delivered":
                if record.get("delivered"):
                    outcome = "delivered"
                else:
                    outcome = "failed" if record.get("final") else "retrying"
                self.deliveries.labels(outcome).inc()


def install(services: Services) -> None:
    services.metrics.registry.register(LiveCollector(services))
    services.audit.observers.append(AuditObserver(services))
