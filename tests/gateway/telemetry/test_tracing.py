"""OpenTelemetry spans from a real gateway, caught by the SDK's in-memory exporter:
one per request, one per stage (policy, approval, sandbox by name), parented right,
carrying ids and outcomes but never code or tokens."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from aiohttp.test_utils import TestClient
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.appkeys import SERVICES
from gateway.settings.model import TelemetrySettings
from gateway.telemetry.tracing import Tracing
from tests.gateway.conftest import auth

pytestmark = pytest.mark.integration


@pytest.fixture
def spans(client: TestClient) -> InMemorySpanExporter:
    exporter = InMemorySpanExporter()
    settings = TelemetrySettings(enabled=True, exporter="console")
    client.app[SERVICES].tracing = Tracing.from_settings(settings, exporter=exporter)
    return exporter


async def test_an_execution_is_one_trace_with_a_span_per_stage(
    client: TestClient, token: Callable[..., str], spans: InMemorySpanExporter
) -> None:
    code = "print('secret-looking code 6*7')"
    tok = token()
    resp = await client.post(
        "/v1/executions", json={"language": "python", "code": code}, headers=auth(tok)
    )
    assert resp.status == 200
    finished = {span.name: span for span in spans.get_finished_spans()}
    root = finished["execgate.request"]
    assert {"execgate.policy", "execgate.sandbox", "execgate.authenticate"} <= set(finished)
    for name, span in finished.items():
        assert span.context.trace_id == root.context.trace_id, name
        if name != "execgate.request":
            assert span.parent is not None and span.parent.span_id == root.context.span_id
    assert root.attributes["execgate.code"] == "ok"
    assert root.attributes["execgate.tenant"] == "acme"
    assert finished["execgate.sandbox"].attributes["execgate.status"] == "ok"
    assert finished["execgate.policy"].attributes["execgate.allow"] is True
    assert root.resource.attributes["service.name"] == "execgate"
    everything = repr([dict(s.attributes or {}) for s in finished.values()])
    assert tok not in everything and "6*7" not in everything


async def test_denied_and_held_requests_say_where_they_stopped(
    client: TestClient, token: Callable[..., str], spans: InMemorySpanExporter
) -> None:
    await client.post(
        "/v1/executions",
        json={"language": "python", "code": "import ctypes"},
        headers=auth(token()),
    )
    finished = {span.name: span for span in spans.get_finished_spans()}
    assert "execgate.approval" in finished
    assert finished["execgate.request"].attributes["execgate.code"] == "held"
    assert "execgate.sandbox" not in finished

    spans.clear()
    await client.post(
        "/v1/executions", json={"language": "python", "code": "1"}, headers=auth("forged")
    )
    [root] = [s for s in spans.get_finished_spans() if s.name == "execgate.request"]
    assert root.attributes["execgate.code"] == "unauthenticated"
    assert not root.status.is_ok


def test_disabled_tracing_is_a_no_op() -> None:
    tracing = Tracing.from_settings(TelemetrySettings())
    assert not tracing.enabled and tracing.request(None) is None  # type: ignore[arg-type]
