"""Admission against both states: the in-process one and a real redis-server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from gateway.admission.gate import Admission, policy_header
from gateway.errors import GatewayError
from gateway.settings.model import AdmissionSettings, TenantSettings
from gateway.state.memory import MemoryState
from gateway.state.redis_state import PREFIX, RedisState
from tests.redis_server import RedisServer, redis_server  # noqa: F401
from tests.waiting import HUNG_S, until

# An interval of 1000 s: nothing refills while a test runs, so no test waits on time.
SLOW = {"rate_per_s": 0.001}


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.integration)])
async def admission(request: pytest.FixtureRequest) -> AsyncIterator[Admission]:
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        state = RedisState(server.url)
    else:
        state = MemoryState()
    adm = Admission(state, AdmissionSettings(max_concurrent_executions=4, queue_timeout_s=0.3))
    await adm.start()
    yield adm
    await adm.close()


async def test_burst_then_refused_with_headers(admission: Admission) -> None:
    limits = TenantSettings(**SLOW, burst=3, max_concurrent=100)
    for _ in range(3):
        await (await admission.admit("t", limits)).release()
    with pytest.raises(GatewayError) as exc:
        await admission.admit("t", limits)
    assert exc.value.code == "rate_limited" and exc.value.status == 429
    headers = exc.value.headers
    assert int(headers["Retry-After"]) >= 900
    assert headers["RateLimit"] == f'"rate";r=0;t={headers["Retry-After"]}'
    assert headers["RateLimit-Policy"] == policy_header(limits)
    assert '"rate";q=3;w=3000' in headers["RateLimit-Policy"]


async def test_tenants_do_not_share_rate(admission: Admission) -> None:
    limits = TenantSettings(**SLOW, burst=1)
    await (await admission.admit("a", limits)).release()
    await (await admission.admit("b", limits)).release()
    with pytest.raises(GatewayError):
        await admission.admit("a", limits)


async def test_concurrency_leases_and_idempotent_release(admission: Admission) -> None:
    limits = TenantSettings(rate_per_s=1000, burst=1000, max_concurrent=2)
    one, two = await admission.admit("t", limits), await admission.admit("t", limits)
    with pytest.raises(GatewayError, match="concurrent"):
        await admission.admit("t", limits)
    await one.release()
    await one.release()
    assert (await admission.usage("t", limits))["concurrent"] == 1
    await (await admission.admit("t", limits)).release()
    await two.release()
    assert (await admission.usage("t", limits))["concurrent"] == 0


async def test_executions_per_day(admission: Admission) -> None:
    limits = TenantSettings(rate_per_s=1000, burst=1000, executions_per_day=2)
    for _ in range(2):
        await (await admission.admit("t", limits)).release()
    with pytest.raises(GatewayError) as exc:
        await admission.admit("t", limits)
    assert exc.value.code == "quota_exceeded" and exc.value.headers["RateLimit"].startswith('"day"')
    assert 1 <= int(exc.value.headers["Retry-After"]) <= 86400
    assert (await admission.usage("t", limits))["executions_today"] == 2


async def test_cpu_seconds_charged_from_measured_usage(admission: Admission) -> None:
    limits = TenantSettings(rate_per_s=1000, burst=1000, cpu_s_per_hour=10)
    await admission.charge_cpu("t", 4.25)
    await admission.charge_cpu("t", 6.0)
    assert (await admission.usage("t", limits))["cpu_s_last_hour"] == 10.25
    with pytest.raises(GatewayError) as exc:
        await admission.admit("t", limits)
    assert exc.value.code == "quota_exceeded" and exc.value.headers["RateLimit"].startswith('"cpu"')
    assert 1 <= int(exc.value.headers["Retry-After"]) <= 3600


async def test_a_refusal_spends_nothing(admission: Admission) -> None:
    """Refused on concurrency: the rate token and the day count stay unspent."""
    limits = TenantSettings(**SLOW, burst=2, max_concurrent=1, executions_per_day=5)
    held = await admission.admit("t", limits)
    for _ in range(5):
        with pytest.raises(GatewayError, match="concurrent"):
            await admission.admit("t", limits)
    await held.release()
    await (await admission.admit("t", limits)).release()
    assert (await admission.usage("t", limits))["executions_today"] == 2


async def waiting(state: object, count: int) -> bool:
    """`count` requests wait for a global slot, as the state itself records them."""
    if isinstance(state, MemoryState):
        return len(state._waiting) == count
    assert isinstance(state, RedisState)
    return bool(await state.client.zcard(f"{PREFIX}waiting") == count)


async def test_global_cap_goes_to_the_tenant_holding_fewest(admission: Admission) -> None:
    """A flooding tenant holds every global slot; as slots free up, the tenant that
    waits with fewer slots gets them, so the flood cannot starve it."""
    limits = TenantSettings(rate_per_s=1000, burst=1000, max_concurrent=100)
    # The same state, with a queue that only a hung test outwaits: the waiters
    # are counted in the state, not given a few milliseconds to get there.
    patient = Admission(admission.state, AdmissionSettings(max_concurrent_executions=4,
                                                          queue_timeout_s=HUNG_S))  # fmt: skip
    flood = [await patient.admit("flood", limits) for _ in range(4)]
    flood_waiters = [asyncio.create_task(patient.admit("flood", limits)) for _ in range(6)]
    await until(lambda: waiting(admission.state, 6), what="six flood requests wait")
    quiet = asyncio.create_task(patient.admit("quiet", limits))
    await until(lambda: waiting(admission.state, 7), what="the quiet request waits too")
    assert not quiet.done()
    await flood[0].release()
    slot = await asyncio.wait_for(quiet, HUNG_S)
    assert slot.tenant == "quiet"
    assert not any(t.done() for t in flood_waiters)
    await slot.release()
    for held in flood[1:]:
        await held.release()
    # Each waiter in turn gets a slot and gives it back (six waiters, four slots).
    for next_done in asyncio.as_completed(flood_waiters):
        await (await next_done).release()


async def test_queue_times_out_cleanly(admission: Admission) -> None:
    limits = TenantSettings(rate_per_s=1000, burst=1000, max_concurrent=100)
    held = [await admission.admit("a", limits) for _ in range(4)]
    with pytest.raises(GatewayError) as exc:
        await admission.admit("b", limits)
    assert exc.value.code == "queue_timeout" and exc.value.status == 503
    assert "Retry-After" in exc.value.headers
    # The refused request holds no tenant lease either.
    assert (await admission.usage("b", limits))["concurrent"] == 0
    for slot in held:
        await slot.release()
    await (await admission.admit("b", limits)).release()


async def test_memory_windows_roll_over() -> None:
    clock = Clock()
    adm = Admission(MemoryState(clock))
    limits = TenantSettings(rate_per_s=1000, burst=1000, cpu_s_per_hour=10, executions_per_day=1)
    await adm.charge_cpu("t", 10.5)
    with pytest.raises(GatewayError, match="CPU"):
        await adm.admit("t", limits)
    clock.now += 3601
    assert (await adm.usage("t", limits))["cpu_s_last_hour"] == 0
    await (await adm.admit("t", limits)).release()
    with pytest.raises(GatewayError, match="per day"):
        await adm.admit("t", limits)
    clock.now += 86400
    await (await adm.admit("t", limits)).release()


async def test_a_pass_through_spends_the_rate_shared_with_executions(
    admission: Admission,
) -> None:
    limits = TenantSettings(**SLOW, burst=3, max_concurrent=1, executions_per_day=1)
    await admission.spend_rate("t", limits)
    await admission.spend_rate("t", limits)
    # Rate only: no day count, no concurrency lease was spent.
    assert (await admission.usage("t", limits))["executions_today"] == 0
    slot = await admission.admit("t", limits)  # the third unit of the burst
    for spend in (lambda: admission.spend_rate("t", limits), lambda: admission.admit("t", limits)):
        with pytest.raises(GatewayError) as exc:
            await spend()
        assert exc.value.code == "rate_limited" and exc.value.extra["limit"] == "rate"
        assert exc.value.headers["RateLimit"].startswith('"rate";r=0;')
    await slot.release()
    await admission.spend_rate("u", limits)  # another tenant's rate is its own
