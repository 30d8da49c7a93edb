"""Two real gateway processes sharing one Redis: limits hold for their sum, and an
approval decided on one replica is honoured (and spent once) on the other."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from standardwebhooks.webhooks import Webhook

from gateway.bench.process import GatewayProcess
from tests.gateway.state.gateways import gateway_env, token
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration


def replicas(root: Path, server: RedisServer, **settings: str) -> Iterator[list[GatewayProcess]]:
    gateways = []
    for name in ("a", "b"):
        own = root / name
        own.mkdir()
        env = gateway_env(root, server.url, **settings)
        # Keys and Redis are shared; each replica has its own audit chain and SQLite.
        env["EXECGATE_AUDIT_PATH"] = str(own / "audit.jsonl")
        env["EXECGATE_STATE_PATH"] = str(own / "state.db")
        gateways.append(GatewayProcess(env, own / "gateway.log"))
    token(root)  # the shared development key exists before either replica starts
    try:
        for gateway in gateways:
            gateway.start()
        yield gateways
    finally:
        for gateway in gateways:
            gateway.stop()


@pytest.fixture
def pair(tmp_path: Path, redis_server: RedisServer, request: pytest.FixtureRequest) -> Any:
    yield from replicas(tmp_path, redis_server, **request.param)


def records(gateway: GatewayProcess) -> list[dict[str, Any]]:
    path = Path(gateway.env["EXECGATE_AUDIT_PATH"])
    return [json.loads(line) for line in path.read_text().splitlines()]


async def post(session: aiohttp.ClientSession, url: str, bearer: str, body: Any) -> Any:
    headers = {"Authorization": f"Bearer {bearer}"}
    async with session.post(url, json=body, headers=headers) as resp:
        return resp.status, await resp.json(), dict(resp.headers)


def max_overlap(intervals: list[tuple[datetime, datetime]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def runs(gateways: list[GatewayProcess], tenant: str | None = None) -> list[tuple[Any, Any]]:
    """[started, finished] of every execution on any replica: inside its slot's lease."""
    ts: dict[str, dict[str, datetime]] = {}
    for gateway in gateways:
        for r in records(gateway):
            if r["type"] not in ("execution.started", "execution.finished"):
                continue
            if tenant is None or r["tenant"] == tenant:
                when = datetime.fromisoformat(r["ts"].replace("Z", "+00:00"))
                ts.setdefault(r["execution_id"], {})[r["type"]] = when
    return [(t["execution.started"], t["execution.finished"]) for t in ts.values()]


RATE = {
    "EXECGATE_TENANTS_ACME_RATE_PER_S": "0.001",
    "EXECGATE_TENANTS_ACME_BURST": "10",
    "EXECGATE_TENANTS_ACME_MAX_CONCURRENT": "100",
}


@pytest.mark.parametrize("pair", [RATE], indirect=True)
async def test_combined_rate_stays_within_the_tenants_limit(
    pair: list[GatewayProcess], tmp_path: Path
) -> None:
    bearer = token(tmp_path)
    body = {"language": "python", "code": "print(1)"}
    async with aiohttp.ClientSession() as session:
        answers = await asyncio.gather(
            *(post(session, f"{pair[i % 2].url}/v1/executions", bearer, body) for i in range(30))
        )
    statuses = sorted(status for status, _, _ in answers)
    assert statuses == [200] * 10 + [429] * 20
    for status, answer, headers in answers:
        if status == 429:
            assert answer["error"]["code"] == "rate_limited"
            assert int(headers["Retry-After"]) > 0 and headers["RateLimit"].startswith('"rate"')
    limited = [r for g in pair for r in records(g) if r["type"] == "rate.limited"]
    assert len(limited) == 20


SLOW = {
    "EXECGATE_BACKENDS_NOOP_SLEEP_S": "1.5",
    "EXECGATE_TENANTS_ACME_MAX_CONCURRENT": "3",
    "EXECGATE_TENANTS_BETA_MAX_CONCURRENT": "3",
    "EXECGATE_ADMISSION_MAX_CONCURRENT_EXECUTIONS": "4",
    "EXECGATE_ADMISSION_QUEUE_TIMEOUT_S": "0.3",
}


@pytest.mark.parametrize("pair", [SLOW], indirect=True)
async def test_combined_concurrency_and_global_cap(
    pair: list[GatewayProcess], tmp_path: Path
) -> None:
    body = {"language": "python", "code": "print(1)"}
    tokens = {tenant: token(tmp_path, tenant) for tenant in ("acme", "beta")}
    async with aiohttp.ClientSession() as session:
        answers = await asyncio.gather(
            *(
                post(session, f"{pair[i % 2].url}/v1/executions", tokens[tenant], body)
                for i in range(8)
                for tenant in ("acme", "beta")
            )
        )
    codes = [a["error"]["code"] for s, a, _ in answers if s != 200]
    assert set(codes) <= {"rate_limited", "queue_timeout"}, codes
    assert max_overlap(runs(pair, "acme")) <= 3 and max_overlap(runs(pair, "beta")) <= 3
    assert max_overlap(runs(pair)) <= 4
    # Neither tenant was starved by the other.
    assert runs(pair, "acme") and runs(pair, "beta")


async def test_an_approval_on_one_replica_is_honoured_by_the_other(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    gen = replicas(tmp_path, redis_server, EXECGATE_APPROVALS_RUN_HELD="false")
    a, b = next(gen)
    try:
        held_body = {"language": "python", "code": "import ctypes\nprint(1)\n"}
        async with aiohttp.ClientSession() as session:
            url = f"{a.url}/v1/executions"
            status, held, _ = await post(session, url, token(tmp_path), held_body)
            assert status == 202, held
            approval_id = held["approval_id"]
            approver = token(tmp_path, scopes="approvals:decide approvals:read", sub="alice")
            decision = {"decision": "approve", "reason": "fine"}
            url = f"{b.url}/v1/approvals/{approval_id}/decision"
            status, decided, _ = await post(session, url, approver, decision)
            assert status == 200 and decided["status"] == "approved", decided
            again = dict(held_body, approval_token=decided["approval_token"])
            status, ran, _ = await post(session, f"{a.url}/v1/executions", token(tmp_path), again)
            assert status == 200, ran
            # Spent on replica a: replica b refuses the same token.
            status, refused, _ = await post(
                session, f"{b.url}/v1/executions", token(tmp_path), again
            )
            assert status == 403 and refused["error"]["code"] == "approval_invalid", refused
    finally:
        gen.close()


CRASH = {
    "EXECGATE_BACKENDS_NOOP_SLEEP_S": "5",
    "EXECGATE_TENANTS_ACME_MAX_CONCURRENT": "1",
    "EXECGATE_ADMISSION_LEASE_TTL_S": "2",
}


@pytest.mark.parametrize("pair", [CRASH], indirect=True)
async def test_a_crashed_replicas_slot_comes_back(
    pair: list[GatewayProcess], tmp_path: Path
) -> None:
    a, b = pair
    bearer = token(tmp_path)
    body = {"language": "python", "code": "print(1)"}
    async with aiohttp.ClientSession() as session:
        running = asyncio.ensure_future(post(session, f"{a.url}/v1/executions", bearer, body))
        for _ in range(200):
            await asyncio.sleep(0.05)
            if any(r["type"] == "execution.started" for r in records(a)):
                break
        status, answer, _ = await post(session, f"{b.url}/v1/executions", bearer, body)
        assert status == 429 and answer["error"]["limit"] == "concurrency", answer
        await asyncio.to_thread(a.kill)  # mid-execution: its lease is never released
        with pytest.raises(aiohttp.ClientError):
            await running
        # Nobody renews the dead replica's lease: it lapses and b admits again.
        for _ in range(100):
            await asyncio.sleep(0.2)
            status, answer, _ = await post(session, f"{b.url}/v1/executions", bearer, body)
            if status != 429:
                break
        assert status == 200, answer


async def test_a_decision_callback_acts_once_across_replicas(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """The webhook-id replay cache lives in Redis: a callback taken by replica a and
    replayed to replica b within the tolerance window is not acted on again."""
    secret = "whsec_" + base64.b64encode(b"callback-secret-of-32-bytes!!!!!").decode()
    (tmp_path / "callback.secret").write_text(secret)
    env = {"EXECGATE_APPROVALS_CALLBACK_SECRET_FILE": str(tmp_path / "callback.secret")}
    gen = replicas(tmp_path, redis_server, **env)
    a, b = next(gen)
    try:
        async with aiohttp.ClientSession() as session:
            body = {"language": "python", "code": "import ctypes\nprint(1)\n"}
            status, held, _ = await post(session, f"{a.url}/v1/executions", token(tmp_path), body)
            assert status == 202, held
            decision = {"approval_id": held["approval_id"], "decision": "deny", "approver": "carol"}

            async def send(replica: GatewayProcess, message: dict[str, Any]) -> tuple[int, Any]:
                text, now = json.dumps(message), datetime.now(UTC)
                headers = {
                    "webhook-id": "msg_shared",
                    "webhook-timestamp": str(int(now.timestamp())),
                    "webhook-signature": Webhook(secret).sign("msg_shared", now, text),
                    "content-type": "application/json",
                }
                decision_url = f"{replica.url}/v1/approvals/{held['approval_id']}/decision"
                async with session.post(decision_url, data=text, headers=headers) as resp:
                    return resp.status, await resp.json()

            status, first = await send(a, decision)
            assert status == 200 and first["duplicate"] is False, first
            status, replayed = await send(b, decision)
            assert status == 200 and replayed["duplicate"] is True, replayed
            status, reused = await send(b, {**decision, "decision": "approve"})
            assert status == 409 and reused["error"]["reason"] == "webhook_id_reused", reused
        decided = [r for g in (a, b) for r in records(g) if r["type"] == "approval.decided"]
        assert len(decided) == 1 and decided[0]["decision"] == "deny"
        assert [r["type"] for r in records(b) if r["type"].startswith("approval.callback")] == [
            "approval.callback_duplicate",
            "approval.callback_refused",
        ]
    finally:
        gen.close()
