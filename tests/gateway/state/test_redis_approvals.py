"""Approval records on a real redis-server, seen from two clients (two replicas)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import asdict

import pytest

from gateway.approvals.records import Approval, ApprovalError
from gateway.state.redis_approvals import RedisApprovalStore
from gateway.state.redis_state import RedisState
from tests.gateway.approvals.test_records import assert_one_winner
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration  # drives a real Redis


def approval(i: str = "apr_1", ttl: float = 60, tenant: str = "acme") -> Approval:
    now = time.time()
    return Approval(
        id=i,
        tenant=tenant,
        requester="alice",
        execution_id="exe_1",
        principal={"sub": "alice", "tenant": tenant, "scopes": [], "claims": {}},
        request={"language": "python", "code": "import ctypes", "files": [], "limits": {}},
        language="python",
        code_sha256="0" * 64,
        features=[],
        reasons=["why"],
        created_at=now,
        expires_at=now + ttl,
    )


@pytest.fixture
async def replicas(redis_server: RedisServer) -> AsyncIterator[list[RedisApprovalStore]]:
    states = [RedisState(redis_server.url) for _ in range(2)]
    for state in states:
        await state.start()
    yield [RedisApprovalStore(state) for state in states]
    for state in states:
        await state.close()


async def test_round_trip_keeps_every_field(replicas: list[RedisApprovalStore]) -> None:
    a, b = replicas
    original = approval()
    await a.create(original)
    got = await b.get("apr_1")
    assert got is not None and asdict(got) == asdict(original)
    await a.update("apr_1", delivery={"status": "delivered", "attempt": 1})
    got = await b.get("apr_1")
    assert got is not None and got.delivery == {"status": "delivered", "attempt": 1}
    assert await b.get("apr_missing") is None


async def test_one_decision_wins_across_replicas(replicas: list[RedisApprovalStore]) -> None:
    a, b = replicas
    await a.create(approval())
    results = await asyncio.gather(
        a.decide("apr_1", "approve", "bob", "ok"),
        b.decide("apr_1", "deny", "carol", "no"),
        return_exceptions=True,
    )
    decided = assert_one_winner(results)
    assert decided.decided_at
    # Both replicas read the winner's decision.
    for replica in (a, b):
        stored = await replica.get("apr_1")
        assert stored is not None
        assert (stored.status, stored.approver) == (decided.status, decided.approver)
    word = {"approved": "approve", "denied": "deny"}[decided.status]
    again, changed = await b.decide("apr_1", word, "x", "")
    assert changed is False and again.status == decided.status
    with pytest.raises(ApprovalError) as exc:
        await a.decide("apr_missing", "approve", "bob", "")
    assert exc.value.kind == "not_found"
    assert await a.list(status="pending") == []


async def test_expiry_is_audited_by_one_replica(replicas: list[RedisApprovalStore]) -> None:
    a, b = replicas
    await a.create(approval(ttl=-1))
    await a.create(approval("apr_2", ttl=600))
    first, second = await asyncio.gather(a.expire_due(), b.expire_due())
    assert sorted(x.id for x in first + second) == ["apr_1"]
    with pytest.raises(ApprovalError) as exc:
        await b.decide("apr_1", "approve", "bob", "")
    assert exc.value.kind == "expired"
    assert [x.id for x in await b.list(status="pending")] == ["apr_2"]


async def test_list_filters(replicas: list[RedisApprovalStore]) -> None:
    a, b = replicas
    await a.create(approval("apr_1"))
    await a.create(approval("apr_2", tenant="other"))
    await a.create(approval("apr_3"))
    await a.decide("apr_3", "deny", "bob", "")
    assert {x.id for x in await b.list(tenant="acme")} == {"apr_1", "apr_3"}
    assert [x.id for x in await b.list(status="denied")] == ["apr_3"]
    assert len(await b.list(limit=2)) == 2


async def test_a_token_id_is_spent_once_across_replicas(
    replicas: list[RedisApprovalStore],
) -> None:
    a, b = replicas
    expires = time.time() + 60
    spent = await asyncio.gather(
        *(store.spend_token("jti-1", expires) for store in (a, b) for _ in range(10))
    )
    assert spent.count(True) == 1
