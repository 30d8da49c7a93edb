"""Redis stops under a running gateway: limits fail closed, audited, nothing runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway.app import create_app
from gateway.settings.model import load_settings
from tests.gateway.state.gateways import gateway_env, token
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration  # drives a real Redis

BODY = {"language": "python", "code": "print(1)"}


def records(root: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (root / "audit.jsonl").read_text().splitlines()]


async def test_redis_down_fails_closed(
    aiohttp_client: Any, redis_server: RedisServer, tmp_path: Path
) -> None:
    settings = load_settings(None, env=gateway_env(tmp_path, redis_server.url))
    client: TestClient = await aiohttp_client(create_app(settings))
    headers = {"Authorization": f"Bearer {token(tmp_path)}"}
    resp = await client.post("/v1/executions", json=BODY, headers=headers)
    assert resp.status == 200, await resp.text()

    redis_server.stop()
    resp = await client.post("/v1/executions", json=BODY, headers=headers)
    body = await resp.json()
    assert resp.status == 503 and body["error"]["code"] == "state_unavailable", body
    last = records(tmp_path)[-1]
    assert last["type"] == "request.rejected" and last["code"] == "state_unavailable"
    assert last["outcome"] == "state_error"
    started = [r for r in records(tmp_path) if r["type"] == "execution.started"]
    assert len(started) == 1  # only the run before Redis stopped
    ready = await client.get("/readyz")
    assert ready.status == 503 and "state" in (await ready.json())["missing"]

    redis_server.start()
    resp = await client.post("/v1/executions", json=BODY, headers=headers)
    assert resp.status == 200, await resp.text()
    assert (await client.get("/readyz")).status == 200
