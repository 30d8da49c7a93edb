"""Liveness, readiness, metrics and the OpenAPI document of a real gateway."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from aiohttp.test_utils import TestClient

from gateway.models import ExecutionRequest
from tests.gateway.conftest import auth

pytestmark = pytest.mark.integration


async def test_healthz_and_readyz(client: TestClient) -> None:
    assert await (await client.get("/healthz")).json() == {"status": "ok"}
    resp = await client.get("/readyz")
    body = await resp.json()
    assert resp.status == 200, body
    assert set(body["checks"]) == {"policy", "backend:nsjail", "state", "audit"}


async def test_metrics_count_requests(client: TestClient, token: Callable[..., str]) -> None:
    await client.post(
        "/v1/executions", json={"language": "python", "code": "print(1)"}, headers=auth(token())
    )
    text = await (await client.get("/metrics")).text()
    assert 'execgate_executions_total{backend="nsjail",status="ok"} 1.0' in text
    assert "execgate_policy_decision_duration_seconds_bucket" in text


async def test_openapi_is_generated_from_the_request_model(client: TestClient) -> None:
    doc = await (await client.get("/openapi.json")).json()
    assert doc["openapi"].startswith("3.1")
    schema = doc["components"]["schemas"]["ExecutionRequest"]
    assert schema["required"] == ["language", "code"]
    assert set(schema["properties"]) == set(ExecutionRequest.model_fields)
    assert schema.get("additionalProperties") is False
    assert "/v1/executions" in doc["paths"]
