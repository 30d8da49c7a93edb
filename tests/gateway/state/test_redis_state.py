"""Leases on a real redis-server: renewed while held, lapsing when a replica dies;
single-use claims shared by replicas (and the in-process state's same rules)."""

from __future__ import annotations

import asyncio

import pytest

from gateway.admission.gate import Admission
from gateway.errors import GatewayError
from gateway.settings.model import AdmissionSettings, TenantSettings
from gateway.state.memory import MemoryState
from gateway.state.redis_state import RedisState
from tests.redis_server import RedisServer

pytestmark = pytest.mark.integration  # drives a real Redis

LIMITS = TenantSettings(rate_per_s=1000, burst=1000, max_concurrent=1)


async def replica(server: RedisServer, lease_ttl_s: float = 30.0) -> Admission:
    settings = AdmissionSettings(max_concurrent_executions=1, lease_ttl_s=lease_ttl_s)
    adm = Admission(RedisState(server.url), settings)
    await adm.start()
    return adm


async def test_a_dead_replicas_leases_lapse(redis_server: RedisServer) -> None:
    dying, survivor = await replica(redis_server, 1.5), await replica(redis_server)
    await dying.admit("t", LIMITS)
    await dying.close()  # gone without releasing (a crash keeps nothing renewing)
    with pytest.raises(GatewayError, match="concurrent"):
        await survivor.admit("t", LIMITS)
    for _ in range(100):
        await asyncio.sleep(0.1)
        if (await survivor.usage("t", LIMITS))["concurrent"] == 0:
            break
    slot = await survivor.admit("t", LIMITS)
    await slot.release()
    await survivor.close()


async def test_held_leases_are_renewed(redis_server: RedisServer) -> None:
    holder, other = await replica(redis_server, 1.5), await replica(redis_server)
    slot = await holder.admit("t", LIMITS)
    await asyncio.sleep(3.5)  # more than twice the lease: only renewal keeps it
    assert (await other.usage("t", LIMITS))["concurrent"] == 1
    with pytest.raises(GatewayError, match="concurrent"):
        await other.admit("t", LIMITS)
    await slot.release()
    await (await other.admit("t", LIMITS)).release()
    await holder.close()
    await other.close()


async def test_redis_down_admits_nothing(redis_server: RedisServer) -> None:
    adm = await replica(redis_server)
    redis_server.stop()
    for call in (adm.admit("t", LIMITS), adm.usage("t", LIMITS)):
        with pytest.raises(GatewayError) as exc:
            await call
        assert exc.value.code == "state_unavailable" and exc.value.status == 503
    assert (await adm.state.health())[0] is False
    redis_server.start()
    await (await adm.admit("t", LIMITS)).release()
    await adm.close()


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def test_claims_are_once_per_key_and_lapse(redis_server: RedisServer) -> None:
    """claim_once (webhook ids of decision callbacks): the first claim wins on every
    replica, later ones learn its value, and the key lapses after its ttl."""
    replicas = [RedisState(redis_server.url), RedisState(redis_server.url)]
    for state in replicas:
        await state.start()
    first, second = replicas
    answers = await asyncio.gather(
        *(state.claim_once("webhook:m1", f"body-{i}", 1.0) for i, state in enumerate(replicas * 5))
    )
    winners = [i for i, answer in enumerate(answers) if answer is None]
    assert len(winners) == 1
    stored = f"body-{winners[0] % 2}"
    assert all(answer == stored for answer in answers if answer is not None)
    assert await second.claim_once("webhook:m2", "x", 30) is None
    await asyncio.sleep(1.2)
    assert await first.claim_once("webhook:m1", "later", 30) is None  # lapsed
    assert await second.claim_once("webhook:m1", "again", 30) == "later"
    for state in replicas:
        await state.close()


async def test_memory_claims_match_redis() -> None:
    clock = Clock()
    state = MemoryState(clock=clock)
    assert await state.claim_once("webhook:m1", "a", 10) is None
    assert await state.claim_once("webhook:m1", "b", 10) == "a"
    clock.now += 11
    assert await state.claim_once("webhook:m1", "b", 10) is None
    assert await state.claim_once("webhook:m1", "c", 10) == "b"
