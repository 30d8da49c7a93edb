"""A real gateway for approval tests: nsjail, Rego, audit, a webhook receiver on
127.0.0.1 that verifies signatures with the Standard Webhooks reference library,
approvers with their own tokens. A test module imports the fixtures it uses
(`from ... import start_fixture, ...`: the functions' names differ from the
fixtures' own, so a test's parameter does not shadow an import)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jwt
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from cryptography.hazmat.primitives import serialization
from standardwebhooks.webhooks import Webhook

from gateway.app import create_app
from gateway.auth.keys import load_or_create_dev_secret
from gateway.auth.tokens import mint_token
from gateway.settings.model import Settings
from tests.gateway.conftest import auth, make_settings, require_root

SECRET = "whsec_" + base64.b64encode(b"webhook-secret-of-32-bytes!!!!!!").decode()
CALLBACK = "whsec_" + base64.b64encode(b"callback-secret-of-32-bytes!!!!!").decode()
NATIVE = {"language": "python", "code": "import ctypes\nprint(ctypes.sizeof(ctypes.c_int))"}


class Receiver:
    """A third party's webhook endpoint: verifies like they would, can misbehave."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.failures = 0  # answer 500 this many times first
        self.hang_s = 0.0
        self.bad_signatures = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        try:
            payload = Webhook(SECRET).verify(body, dict(request.headers))
        except Exception:
            self.bad_signatures += 1
            return web.Response(status=400)
        if self.hang_s:
            await asyncio.sleep(self.hang_s)
        if self.failures > 0:
            self.failures -= 1
            return web.Response(status=500)
        self.received.append(payload)
        return web.Response(status=204)


@pytest.fixture(name="receiver")
async def receiver_fixture(aiohttp_server: Any) -> AsyncIterator[tuple[Receiver, str]]:
    r = Receiver()
    app = web.Application()
    app.router.add_post("/hook", r.handle)
    server = await aiohttp_server(app, host="127.0.0.1")
    yield r, str(server.make_url("/hook"))


@pytest.fixture(name="gateway_env")
def gateway_env_fixture(tmp_path: Path, receiver: tuple[Receiver, str]) -> dict[str, str]:
    require_root()
    (tmp_path / "webhook.secret").write_text(SECRET)
    (tmp_path / "callback.secret").write_text(CALLBACK)
    return {
        "EXECGATE_APPROVALS_WEBHOOK_URL": receiver[1],
        "EXECGATE_APPROVALS_WEBHOOK_SECRET_FILE": str(tmp_path / "webhook.secret"),
        "EXECGATE_APPROVALS_CALLBACK_SECRET_FILE": str(tmp_path / "callback.secret"),
        "EXECGATE_APPROVALS_SIGNING_KEY_FILE": str(tmp_path / "approval.pem"),
        "EXECGATE_APPROVALS_BACKOFF_INITIAL_S": "0.05",
        "EXECGATE_APPROVALS_BACKOFF_MAX_S": "0.1",
        "EXECGATE_APPROVALS_EXPIRY_CHECK_S": "0.2",
    }


class Gateway:
    def __init__(self, tmp_path: Path, env: dict[str, str]) -> None:
        self.settings: Settings = make_settings(tmp_path, **env)
        self.server: TestServer | None = None
        self.client: TestClient | None = None

    async def start(self) -> TestClient:
        self.server = TestServer(create_app(self.settings), host="127.0.0.1")
        self.client = TestClient(self.server)
        await self.client.start_server()
        return self.client

    async def stop(self) -> None:
        if self.client is not None:
            await self.client.close()

    def token(self, sub: str = "agent-7", scopes: str = "exec:python", tenant: str = "acme") -> str:
        secret = load_or_create_dev_secret(Path(self.settings.auth.hs256_secret_file))
        return mint_token(secret, tenant=tenant, sub=sub, scopes=scopes.split(), ttl_s=600)

    def approver(self, sub: str = "bob") -> dict[str, str]:
        return auth(self.token(sub=sub, scopes="approvals:read approvals:decide"))


@pytest.fixture(name="start")
async def start_fixture(
    tmp_path: Path, gateway_env: dict[str, str]
) -> AsyncIterator[Callable[..., Any]]:
    started: list[Gateway] = []

    async def make(**env: str) -> tuple[Gateway, TestClient]:
        gw = Gateway(tmp_path, {**gateway_env, **env})
        started.append(gw)
        return gw, await gw.start()

    yield make
    for gw in started:
        await gw.stop()


async def hold(gw: Gateway, client: TestClient, body: dict[str, Any] = NATIVE) -> dict[str, Any]:
    resp = await client.post("/v1/executions", json=body, headers=auth(gw.token()))
    held = await resp.json()
    assert resp.status == 202, held
    return held


async def wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


def signed_callback(
    body: dict[str, Any] | str, msg_id: str, secret: str = CALLBACK, at: datetime | None = None
) -> tuple[str, dict[str, str]]:
    """A decision callback as an approver's tooling signs it (the reference signer)."""
    text = body if isinstance(body, str) else json.dumps(body)
    when = at or datetime.now(UTC)
    return text, {
        "webhook-id": msg_id,
        "webhook-timestamp": str(int(when.timestamp())),
        "webhook-signature": Webhook(secret).sign(msg_id, when, text),
        "content-type": "application/json",
    }


def sign_approval_token(settings: Settings, claims: dict[str, Any]) -> str:
    """A token signed with the gateway's own approval key: only its claims can be wrong."""
    pem = Path(settings.approvals.signing_key_file).read_bytes()
    key = serialization.load_pem_private_key(pem, password=None)
    return jwt.encode(claims, key, algorithm="EdDSA")  # type: ignore[arg-type]


async def approve(gw: Gateway, client: TestClient, approval_id: str) -> str:
    """Approve as an approver JWT (bob); the approval token the answer carries."""
    resp = await client.post(
        f"/v1/approvals/{approval_id}/decision",
        json={"decision": "approve"},
        headers=gw.approver(),
    )
    answer = await resp.json()
    assert resp.status == 200, answer
    return str(answer["approval_token"])
