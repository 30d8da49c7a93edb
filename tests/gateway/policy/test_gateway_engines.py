"""The whole gateway (HTTP, JWT, pipeline, audit) with each policy engine.

The no-op backend runs nothing, so these need neither root nor nsjail; what is
under test is the decision's path: which engine decided, under which revision,
with which decision id, and what happens when the engine is gone.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway.app import create_app
from gateway.auth.keys import load_or_create_dev_secret
from gateway.auth.tokens import mint_token
from gateway.policy.sources import fingerprint
from gateway.settings.model import Settings
from tests.gateway.conftest import audit_records, auth, make_settings
from tests.policies.opa_server import POLICIES, OpaServer, free_port

pytestmark = pytest.mark.integration  # drives a real nsjail

RUN = {"language": "python", "code": "print(1)"}

Start = Callable[..., Awaitable[tuple[Settings, TestClient]]]


@pytest.fixture
def gateway(tmp_path: Path, aiohttp_client: Any) -> Start:
    async def start(**env: str) -> tuple[Settings, TestClient]:
        settings = make_settings(tmp_path, EXECGATE_BACKENDS_DEFAULT="noop", **env)
        return settings, await aiohttp_client(create_app(settings))

    return start


def token(settings: Settings, **claims: Any) -> str:
    secret = load_or_create_dev_secret(Path(settings.auth.hs256_secret_file))
    return mint_token(
        secret, tenant="acme", sub="agent-1", scopes=["exec:python"], ttl_s=300,
        extra_claims=claims or None,
    )  # fmt: skip


def decided(settings: Settings) -> list[dict[str, Any]]:
    return [r for r in audit_records(settings) if r["type"] == "policy.decided"]


async def test_opa_decision_id_joins_both_logs(gateway: Start, opa_server: OpaServer) -> None:
    settings, client = await gateway(
        EXECGATE_POLICY_ENGINE="opa", EXECGATE_POLICY_OPA_URL=opa_server.url
    )
    ready = await client.get("/readyz")
    assert ready.status == 200, await ready.text()
    assert opa_server.revision()[:12] in (await ready.json())["checks"]["policy"]["detail"]
    resp = await client.post("/v1/executions", json=RUN, headers=auth(token(settings)))
    body = await resp.json()
    assert resp.status == 200, body
    [record] = decided(settings)
    assert body["decision_id"] == record["decision_id"]
    assert record["policy_revision"] == fingerprint(POLICIES)
    opa_entry = opa_server.logged_decision(body["decision_id"])
    assert opa_entry["bundles"]["execgate"]["revision"] == record["policy_revision"]

    denied = {**RUN, "network": {"egress": ["evil.example:443"]}}
    refused = await client.post("/v1/executions", json=denied, headers=auth(token(settings)))
    error = (await refused.json())["error"]
    assert refused.status == 403 and error["code"] == "policy_denied", error
    assert opa_server.logged_decision(error["decision_id"])["result"]["allow"] is False


async def test_opa_from_files_decides_and_readyz_says_how(
    gateway: Start, files_opa: OpaServer
) -> None:
    """`opa run --server policies/` as OPA's docs start it: requests are decided (no
    503 policy_invalid), each record names the hash of OPA's files, /readyz explains."""
    settings, client = await gateway(
        EXECGATE_POLICY_ENGINE="opa",
        EXECGATE_POLICY_OPA_URL=files_opa.url,
        EXECGATE_POLICY_TIMEOUT_MS="10000",  # a loaded 2-core machine: no deadline under test
    )
    ready = await client.get("/readyz")
    assert ready.status == 200, await ready.text()
    detail = (await ready.json())["checks"]["policy"]["detail"]
    assert "no bundle" in detail and "opa-files:" in detail
    resp = await client.post("/v1/executions", json=RUN, headers=auth(token(settings)))
    assert resp.status == 200, await resp.text()
    denied = {**RUN, "network": {"egress": ["evil.example:443"]}}
    refused = await client.post("/v1/executions", json=denied, headers=auth(token(settings)))
    assert refused.status == 403, await refused.text()
    revisions = {r["policy_revision"] for r in decided(settings)}
    assert len(revisions) == 1 and revisions.pop().startswith("opa-files:")


async def test_embedded_decision_id_is_ours(gateway: Start) -> None:
    settings, client = await gateway()
    resp = await client.post("/v1/executions", json=RUN, headers=auth(token(settings)))
    body = await resp.json()
    assert resp.status == 200, body
    [record] = decided(settings)
    assert body["decision_id"] == record["decision_id"] and body["decision_id"].startswith("dec_")
    assert record["policy_revision"] == fingerprint(POLICIES)


async def test_opa_down_fails_closed_and_readyz_says_so(gateway: Start) -> None:
    settings, client = await gateway(
        EXECGATE_POLICY_ENGINE="opa", EXECGATE_POLICY_OPA_URL=f"http://127.0.0.1:{free_port()}"
    )
    ready = await client.get("/readyz")
    assert ready.status == 503 and "policy" in (await ready.json())["missing"]
    resp = await client.post("/v1/executions", json=RUN, headers=auth(token(settings)))
    body = await resp.json()
    assert resp.status == 503 and body["error"]["code"] == "policy_unavailable", body
    records = audit_records(settings)
    assert records[-1]["type"] == "request.rejected"
    assert records[-1]["code"] == "policy_unavailable"
    assert not any(r["type"] == "execution.started" for r in records)


async def test_embedded_edit_applies_without_restart(tmp_path: Path, gateway: Start) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(POLICIES, policies)
    settings, client = await gateway(
        EXECGATE_POLICY_PATH=str(policies), EXECGATE_POLICY_RELOAD_INTERVAL_S="0.1"
    )
    first = await client.post("/v1/executions", json=RUN, headers=auth(token(settings)))
    assert first.status == 200
    before = fingerprint(policies)
    # The security team takes python away from acme in the tenant data.
    data_file = policies / "tenants" / "data.json"
    data = json.loads(data_file.read_text())
    data["acme"]["languages"] = ["bash"]
    data_file.write_text(json.dumps(data))
    async with asyncio.timeout(20):
        while True:
            resp = await client.post("/v1/executions", json=RUN, headers=auth(token(settings)))
            if resp.status == 403:
                break
            await asyncio.sleep(0.1)
    assert (await resp.json())["error"]["reasons"] == [
        "language python is not allowed for tenant acme"
    ]
    records = audit_records(settings)
    [reloaded] = [r for r in records if r["type"] == "policy.reloaded"]
    assert reloaded["old_revision"] == before
    assert reloaded["new_revision"] == fingerprint(policies)
    revisions = [r["policy_revision"] for r in decided(settings)]
    assert revisions[0] == before and revisions[-1] == fingerprint(policies)
