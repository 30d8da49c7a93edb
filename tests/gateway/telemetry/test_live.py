"""The metrics the issue asks for, scraped from a real gateway: `execgate_` prefix, base
units, requests, decisions, executions, durations, pools, audit writes, webhook
deliveries and rate-limit rejections."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from aiohttp.test_utils import TestClient
from prometheus_client.parser import text_string_to_metric_families

from backends.attempts import STAGES
from gateway.appkeys import SERVICES
from tests.gateway.conftest import auth

pytestmark = pytest.mark.integration


def families(text: str) -> dict[str, object]:
    return {family.name: family for family in text_string_to_metric_families(text)}


def sample(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    raise AssertionError(f"no sample {name} {labels}")


async def test_every_metric_the_issue_names(client: TestClient, token: Callable[..., str]) -> None:
    headers = auth(token())
    await client.post("/v1/executions", json={"language": "python", "code": "1"}, headers=headers)
    text = await (await client.get("/metrics")).text()
    names = set(families(text))
    assert {
        "execgate_requests",  # the parser drops _total from counter family names
        "execgate_request_duration_seconds",
        "execgate_policy_decisions",
        "execgate_policy_decision_duration_seconds",
        "execgate_executions",
        "execgate_execution_duration_seconds",
        "execgate_rate_limited",
        "execgate_sandbox_pool_ready",
        "execgate_sandboxes_running",
        "execgate_audit_write_duration_seconds",
        "execgate_audit_records",
        "execgate_audit_healthy",
        "execgate_webhook_deliveries",
        "execgate_sandbox_start_failures",
    } <= names
    assert sample(text, "execgate_executions_total", backend="nsjail", status="ok") == 1
    assert sample(text, "execgate_audit_records_total", type="execution.finished") == 1
    assert sample(text, "execgate_audit_write_duration_seconds_count") >= 1
    assert sample(text, "execgate_audit_healthy") == 1
    # Once the pool has refilled after that run: exactly the configured warm pool.
    svc = client.app[SERVICES]
    backend = svc.backends["nsjail"]
    await backend.wait_settled()  # type: ignore[attr-defined]
    wanted = svc.settings.backend_settings("nsjail").warm_pool_size  # type: ignore[attr-defined]
    text = await (await client.get("/metrics")).text()
    ready = sample(text, "execgate_sandbox_pool_ready", backend="nsjail")
    assert wanted > 0 and ready == len(backend.ready_sandboxes) == wanted  # type: ignore[attr-defined]
    # One series per (backend, stage) of a fixed set, from zero: bounded labels.
    stages = {
        s.labels["stage"]
        for s in families(text)["execgate_sandbox_start_failures"].samples  # type: ignore[attr-defined]
        if s.labels.get("backend") == "nsjail" and s.name.endswith("_total")
    }
    assert stages == set(STAGES)
    assert (
        sample(text, "execgate_sandbox_start_failures_total", backend="nsjail", stage="start") == 0
    )


async def test_names_are_prefixed_and_in_base_units(client: TestClient) -> None:
    registry = client.app[SERVICES].metrics.registry
    for family in registry.collect():
        assert family.name.startswith("execgate_"), family.name
        if family.type == "histogram":
            assert family.name.endswith(("_seconds", "_bytes")), family.name
        assert not family.name.endswith(("_ms", "_milliseconds", "_kb", "_mb")), family.name


async def test_webhook_deliveries_are_counted_as_they_become_durable(client: TestClient) -> None:
    audit = client.app[SERVICES].audit
    for delivered, final in ((False, False), (False, True), (True, True)):
        await audit.append("approval.delivered", delivered=delivered, final=final)
    text = await (await client.get("/metrics")).text()
    for outcome in ("retrying", "failed", "delivered"):
        assert sample(text, "execgate_webhook_deliveries_total", outcome=outcome) == 1
