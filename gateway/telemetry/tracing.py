"""OpenTelemetry traces, optional and off by default (`[telemetry] enabled`).

One span per request (`execgate.request`) with a child per pipeline stage; the stages
the issue names get names of their own: `execgate.policy` (decide), `execgate.approval`
(hold_for_approval) and `execgate.sandbox` (dispatch). Spans carry ids, tenant,
backend, decision id and outcome codes, never code, tokens or outputs.

The tracer comes from a TracerProvider of this gateway's own (OpenTelemetry's global
provider is never set), so two gateways in one process, or a test's in-memory
exporter, stay apart. Disabled, every call here is a no-op and opentelemetry is never
imported: it is an optional dependency (`pip install execgate[telemetry]`).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from gateway.errors import GatewayError
from gateway.settings.model import TelemetrySettings

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

    from gateway.context import ExecContext

# Stage function name -> span name, for the stages operators ask about by purpose.
SPAN_NAMES = {
    "decide": "execgate.policy",
    "hold_for_approval": "execgate.approval",
    "redeem_approval": "execgate.approval_token",
    "dispatch": "execgate.sandbox",
}


class TelemetryUnavailable(Exception):
    """Tracing is enabled but its packages are not installed."""


def _attributes(ctx: ExecContext) -> dict[str, Any]:
    found: dict[str, Any] = {
        "execgate.request_id": ctx.request_id,
        "execgate.execution_id": ctx.execution_id,
        "execgate.ingress": ctx.ingress,
    }
    if ctx.tenant_id:
        found["execgate.tenant"] = ctx.tenant_id
    if ctx.backend:
        found["execgate.backend"] = ctx.backend
    if ctx.decision is not None:
        found["execgate.decision_id"] = ctx.decision.decision_id
        found["execgate.allow"] = ctx.decision.allow
    if ctx.result is not None:
        found["execgate.status"] = ctx.result.status.value
    return found


class Tracing:
    def __init__(self, provider: TracerProvider | None = None) -> None:
        self.provider = provider
        self._tracer: Tracer | None = None
        if provider is not None:
            self._tracer = provider.get_tracer("execgate")
            self._trace = importlib.import_module("opentelemetry.trace")
            self._context = importlib.import_module("opentelemetry.context")

    @classmethod
    def from_settings(
        cls, settings: TelemetrySettings, exporter: SpanExporter | None = None
    ) -> Tracing:
        """`exporter` replaces the configured one (tests: the SDK's in-memory exporter)."""
        if not settings.enabled:
            return cls()
        try:
            resources = importlib.import_module("opentelemetry.sdk.resources")
            sdk_trace = importlib.import_module("opentelemetry.sdk.trace")
            export = importlib.import_module("opentelemetry.sdk.trace.export")
        except ImportError as exc:
            raise TelemetryUnavailable(
                f"telemetry.enabled needs OpenTelemetry: pip install 'execgate[telemetry]' ({exc})"
            ) from None
        if exporter is not None:
            processor = export.SimpleSpanProcessor(exporter)
        else:
            processor = export.BatchSpanProcessor(cls._exporter(settings, export))
        resource = resources.Resource.create({"service.name": settings.service_name})
        provider = sdk_trace.TracerProvider(resource=resource)
        provider.add_span_processor(processor)
        return cls(provider)

    @staticmethod
    def _exporter(settings: TelemetrySettings, export: Any) -> SpanExporter:
        if settings.exporter == "console":
            return export.ConsoleSpanExporter()
        try:
            otlp = importlib.import_module("opentelemetry.exporter.otlp.proto.http.trace_exporter")
        except ImportError:
            raise TelemetryUnavailable(
                "telemetry.exporter = 'otlp' needs opentelemetry-exporter-otlp-proto-http"
            ) from None
        return otlp.OTLPSpanExporter(endpoint=settings.otlp_endpoint)

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def request(self, ctx: ExecContext) -> tuple[Span, object] | None:
        """Start the request's span and make it current for this task."""
        if self._tracer is None:
            return None
        span = self._tracer.start_span("execgate.request", attributes=_attributes(ctx))
        token = self._context.attach(self._trace.set_span_in_context(span))
        return span, token

    def finish(self, handle: tuple[Span, object] | None, ctx: ExecContext, code: str) -> None:
        if handle is None:
            return
        span, token = handle
        span.set_attributes({**_attributes(ctx), "execgate.code": code})
        if code not in ("ok", "held"):
            span.set_status(self._trace.StatusCode.ERROR, code)
        self._context.detach(token)
        span.end()

    @contextlib.contextmanager
    def stage(self, name: str, ctx: ExecContext) -> Iterator[None]:
        if self._tracer is None:
            yield
            return
        span_name = SPAN_NAMES.get(name, f"execgate.{name}")
        with self._tracer.start_as_current_span(
            span_name, record_exception=False, set_status_on_exception=False
        ) as span:
            try:
                yield
            except GatewayError as exc:
                span.set_attribute("execgate.code", exc.code)
                span.set_status(self._trace.StatusCode.ERROR)
                raise
            finally:
                span.set_attributes(_attributes(ctx))

    def shutdown(self) -> None:
        if self.provider is not None:
            self.provider.shutdown()  # flushes what the batch processor holds
