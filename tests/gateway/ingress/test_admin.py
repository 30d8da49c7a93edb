"""The escape self-test through the gateway: on demand, audited, counted, and a
backend out of service refused until an operator clears it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient

from gateway.appkeys import SERVICES
from gateway.escape.catalog.index import techniques
from gateway.ingress.admin import SELFTEST
from tests.gateway.conftest import audit_records, auth
from tests.gateway.escape.weakened import WeakNsjail

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
    # Sound: every technique contained but the few the probes found not applicable.
    counts = result["counts"]
    assert result["sound"] is True and result["problems"] == [], result["problems"]
    assert counts["error"] == 0 and counts["not_applicable"] <= result["max_not_applicable"]
    assert counts["contained"] + counts["not_applicable"] == len(techniques())
    svc = client.server.app[SERVICES]
    records = [json.loads(line) for line in Path(svc.settings.audit.path).read_text().splitlines()]
    selftests = [r for r in records if r["type"] == "sandbox.selftest"]
    assert selftests and selftests[-1]["backend"] == "nsjail"
    assert selftests[-1]["escaped"] == [] and not selftests[-1]["out_of_service"]
    assert selftests[-1]["sound"] is True and selftests[-1]["counts"] == counts
    metrics = await (await client.get("/metrics")).text()
    assert 'execgate_selftest_techniques_total{backend="nsjail",outcome="escaped"} 0.0' in metrics
    assert (await client.get("/readyz")).status == 200


async def test_a_real_escape_takes_the_backend_out_of_service_until_cleared(
    client: TestClient, token: Callable[..., str], canary_dir: Path
) -> None:
    """A weakened nsjail (host network, no seccomp: tests/gateway/escape/weakened.py)
    in the place of the real one: the periodic self-test's run finds the escape,
    takes the backend out of service, audits why; executions are refused (and
    audited) until an operator clears it."""
    svc = client.server.app[SERVICES]
    real = svc.backends["nsjail"]
    settings = svc.settings.backend_settings("nsjail").model_copy(update={"warm_pool_size": 0})
    weak = WeakNsjail(settings, canary_dir)
    await weak.start()
    svc.backends["nsjail"] = weak
    try:
        (result,) = await client.server.app[SELFTEST].run(["nsjail"])
        escaped = {f.technique.id for f in result.escaped}
        assert {"network.tcp_ipv4", "posture.seccomp"} <= escaped, result.problems
        held = svc.out_of_service["nsjail"]
        assert "network.tcp_ipv4" in held and held.startswith("escape self-test: escaped: ")
        records = audit_records(svc.settings)
        (audited,) = [r for r in records if r["type"] == "sandbox.selftest"]
        assert audited["out_of_service"] is True and audited["sound"] is False
        assert set(audited["escaped"]) == escaped
        assert "host: TCP connection" in audited["escaped_details"]["network.tcp_ipv4"]
        metrics = await (await client.get("/metrics")).text()
        assert 'execgate_backend_out_of_service{backend="nsjail"} 1.0' in metrics
        ready = await client.get("/readyz")
        assert ready.status == 503
        detail = (await ready.json())["checks"]["backend:nsjail"]["detail"]
        assert "network.tcp_ipv4" in detail
        runs = weak.runs_seen
        run = await client.post(
            "/v1/executions", json={"language": "python", "code": "print(1)"}, headers=auth(token())
        )
        assert run.status == 503
        refused = await run.json()
        assert refused["error"]["code"] == "backend_unavailable"
        assert weak.runs_seen == runs, "the refused execution reached the backend"
        outcomes = [r.get("outcome") for r in audit_records(svc.settings)[len(records) :]]
        assert "backend_error" in outcomes, outcomes  # the audit outcome of that code
        cleared = await client.post(
            "/v1/admin/backends/nsjail/clear", headers=auth(token(scopes=ADMIN))
        )
        assert await cleared.json() == {"backend": "nsjail", "cleared": True, "was": held}
        (clearing,) = [r for r in audit_records(svc.settings) if r["type"] == "sandbox.cleared"]
        assert clearing["was"] == held and clearing["subject"] == "agent-7"
        assert "nsjail" not in svc.out_of_service
        assert (await client.get("/readyz")).status == 200
        svc.backends["nsjail"] = real
        run = await client.post(
            "/v1/executions", json={"language": "python", "code": "print(1)"}, headers=auth(token())
        )
        assert run.status == 200, await run.text()
        assert (await run.json())["stdout"] == "1\n"
    finally:
        svc.backends["nsjail"] = real
        await weak.close()
