"""The admit stage through the pipeline: audited refusals, per-tenant metrics with a
bounded tenant label, and usage in the policy input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.admission.gate import tenant_label
from gateway.errors import GatewayError
from gateway.pipeline import Pipeline
from gateway.services import Services
from gateway.settings.model import TenantSettings
from tests.gateway.test_pipeline import context, svc  # noqa: F401

BODY = {"language": "python", "code": "print(1)"}


def sample(services: Services, name: str, **labels: str) -> float | None:
    return services.metrics.registry.get_sample_value(name, labels)


async def test_refusal_is_audited_and_counted(svc: Services) -> None:  # noqa: F811
    services = svc
    services.settings.tenants["acme"] = TenantSettings(rate_per_s=0.001, burst=1)
    await Pipeline(services).run(context(BODY))
    with pytest.raises(GatewayError) as exc:
        await Pipeline(services).run(context(BODY))
    assert exc.value.code == "rate_limited"
    lines = Path(services.audit.path).read_text().splitlines()
    last = json.loads(lines[-1])
    assert last["type"] == "rate.limited" and last["code"] == "rate_limited"
    assert [json.loads(r)["type"] for r in lines].count("execution.started") == 1
    assert sample(services, "execgate_tenant_admitted_total", tenant="acme") == 1
    assert sample(services, "execgate_rate_limited_total", tenant="acme", code="rate_limited") == 1
    executed = sample(services, "execgate_tenant_executions_total", tenant="acme", status="ok")
    assert executed == 1
    usage = services.engine.inputs[-1]["tenant"]["usage"]  # type: ignore[attr-defined]
    assert usage["executions_today"] == 1


async def test_tenant_label_is_bounded_by_configuration(svc: Services) -> None:  # noqa: F811
    settings = svc.settings
    settings.tenants["acme"] = TenantSettings()
    assert tenant_label(settings, "acme") == "acme"
    assert tenant_label(settings, "attacker-chosen-" + "x" * 50) == "other"
    assert tenant_label(settings, "default") == "other"
