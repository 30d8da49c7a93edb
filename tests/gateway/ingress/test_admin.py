"""The escape self-test through the gateway: on demand, audited, counted, and a
backend out of service refused until an operator clears it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient

from gateway.appkeys import SERVICES
from tests.gateway.conftest import auth

pytestmark = pytest.mark.integration

ADMIN = "admin:escape-test"


async def test_the_endpoints_need_the_admin_scope(
    client: TestClient, token: Callable[..., str]
) -> None:
    for path in ("/v1/admin/escape-test", "/v1/admin/backends/nsjail/clear"):
        resp = await client.post(path, headers=auth(token()))
        assert resp.status == 403, await resp.text()


async def test_an_on_demand_run_is_audited_and_counted(
    client: TestClient, token: Callable[..., str]
) -> None:
    resp = await client.post(
        "/v1/admin/escape-test?backend=nsjail", headers=auth(token(scopes=ADMIN))
    )
    body = await resp.json()
    assert resp.status == 200, body
    (result,) = body["results"]
    assert result["backend"] == "nsjail" and result["counts"]["escaped"] == 0, [
        f"{t['id']}: {t.get('detail')}" for t in result["techniques"] if t["outcome"] == "escaped"
    ]
    assert result["counts"]["contained"] >= 45
    svc = client.server.app[SERVICES]
    records = [json.loads(line) for line in Path(svc.settings.audit.path).read_text().splitlines()]
    selftests = [r for r in records if r["type"] == "sandbox.selftest"]
    assert selftests and selftests[-1]["backend"] == "nsjail"
    assert selftests[-1]["escaped"] == [] and not selftests[-1]["out_of_service"]
    metrics = await (await client.get("/metrics")).text()
    assert 'execgate_selftest_techniques_total{backend="nsjail",outcome="escaped"} 0.0' in metrics
    assert (await client.get("/readyz")).status == 200


async def test_a_backend_out_of_service_is_refused_until_cleared(
    client: TestClient, token: Callable[..., str]
) -> None:
    svc = client.server.app[SERVICES]
    # What a run with an escape leaves (selftest.py); the proof that escapes are
    # detected is tests/gateway/escape/test_weakened.py.
    svc.out_of_service["nsjail"] = "escape self-test: network.tcp_ipv4 escaped"
    ready = await client.get("/readyz")
    assert ready.status == 503
    detail = (await ready.json())["checks"]["backend:nsjail"]["detail"]
    assert "network.tcp_ipv4" in detail
    run = await client.post(
        "/v1/executions", json={"language": "python", "code": "print(1)"}, headers=auth(token())
    )
    assert run.status == 503
    assert (await run.json())["error"]["code"] == "backend_unavailable"
    cleared = await client.post(
        "/v1/admin/backends/nsjail/clear", headers=auth(token(scopes=ADMIN))
    )
    assert (await cleared.json())["cleared"] is True
    assert (await client.get("/readyz")).status == 200
    run = await client.post(
        "/v1/executions", json={"language": "python", "code": "print(1)"}, headers=auth(token())
    )
    assert run.status == 200, await run.text()
