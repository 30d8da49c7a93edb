"""OPA killed under load: every request fails closed (503 policy_unavailable), nothing
runs without a decision, and service resumes when OPA comes back on the same address.

Real OPA (its own, on a loopback port), a real gateway in-process with the no-op backend
(what is under test is the pipeline's handling of the decision, not a sandbox)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from gateway.app import create_app
from gateway.auth.keys import load_or_create_dev_secret
from gateway.auth.tokens import mint_token
from tests.gateway.conftest import audit_records, auth, make_settings
from tests.policies.opa_server import POLICIES, OpaServer, find_opa

pytestmark = pytest.mark.integration

WORKERS = 8


class Load:
    """WORKERS clients posting executions back to back; every answer kept, in order."""

    def __init__(self, client: TestClient, token: str) -> None:
        self.client, self.token = client, token
        # (sent at, status, code, answered at)
        self.answers: list[tuple[float, int, str, float]] = []
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    async def _worker(self) -> None:
        body = {"language": "python", "code": "print(1)"}
        while not self._stop.is_set():
            sent = time.monotonic()
            resp = await self.client.post("/v1/executions", json=body, headers=auth(self.token))
            payload: dict[str, Any] = await resp.json()
            code = payload["error"]["code"] if "error" in payload else payload["status"]
            self.answers.append((sent, resp.status, code, time.monotonic()))

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker()) for _ in range(WORKERS)]

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)

    async def until(self, predicate: Callable[[], bool], timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            assert time.monotonic() < deadline, Counter(a[1:3] for a in self.answers)
            await asyncio.sleep(0.05)


async def test_opa_killed_under_load_fails_closed_and_recovers(
    aiohttp_client: Any, tmp_path: Path
) -> None:
    opa = OpaServer(find_opa(), POLICIES, tmp_path / "opa").start()
    try:
        settings = make_settings(
            tmp_path,
            EXECGATE_POLICY_ENGINE="opa",
            EXECGATE_POLICY_OPA_URL=opa.url,
            EXECGATE_POLICY_TIMEOUT_MS="5000",  # a slow shared machine is not the fault here
            EXECGATE_BACKENDS_DEFAULT="noop",
        )
        client = await aiohttp_client(create_app(settings))
        secret = load_or_create_dev_secret(Path(settings.auth.hs256_secret_file))
        token = mint_token(secret, tenant="acme", sub="load", scopes=["exec:python"], ttl_s=600)
        load = Load(client, token)
        load.start()

        await load.until(lambda: sum(a[1] == 200 for a in load.answers) >= 20)
        opa.kill_opa()
        killed_at = time.monotonic()
        await load.until(lambda: sum(a[0] > killed_at for a in load.answers) >= 40)
        await asyncio.sleep(0.5)  # past the engine's retries of requests sent at the kill
        ready = await client.get("/readyz")
        assert ready.status == 503 and "policy" in (await ready.json())["missing"]

        restarting_at = time.monotonic()
        await asyncio.to_thread(opa.restart_opa)
        back_at = time.monotonic()
        await load.until(lambda: sum(a[0] > back_at and a[1] == 200 for a in load.answers) >= 10)
        await load.stop()
    finally:
        opa.stop()

    # Sent and answered while OPA was down: refused, every one. (A request waiting in the
    # engine's retry while OPA came back may get a real decision: that is not a fault.)
    during = [a[1:3] for a in load.answers if a[0] > killed_at and a[3] < restarting_at]
    assert len(during) >= 40
    assert set(during) == {(503, "policy_unavailable")}, Counter(during)
    # While OPA restarts it may answer before its bundle is active: an undefined
    # decision, refused as policy_invalid. Never anything else, never a 200 without one.
    refusals = {(503, "policy_unavailable"), (503, "policy_invalid")}
    assert {a[1:3] for a in load.answers} <= {(200, "ok"), *refusals}

    records = audit_records(settings)
    decided = {r["execution_id"] for r in records if r["type"] == "policy.decided" and r["allow"]}
    started = [r["execution_id"] for r in records if r["type"] == "execution.started"]
    assert len(started) == sum(a[1] == 200 for a in load.answers)
    assert set(started) <= decided, "an execution started without an allowing decision"
    refused = [r for r in records if r.get("code") in ("policy_unavailable", "policy_invalid")]
    assert len(refused) == sum(a[1] == 503 for a in load.answers)
