"""Leases on a real redis-server: renewed while held, lapsing when a replica dies."""

from __future__ import annotations

import asyncio

import pytest

from gateway.admission import Admission
from gateway.errors import GatewayError
from gateway.settings import AdmissionSettings, TenantSettings
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
