"""Failed console sign-ins are rate-limited per source address, on an injected clock."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from aiohttp.test_utils import TestClient

from gateway.console.throttle import BURST, INTERVAL_S, SignInThrottle, source_key
from gateway.settings.model import Settings
from tests.gateway.conftest import audit_records
from tests.gateway.console.conftest import origin
from tests.gateway.console.test_session import Clock


def test_a_burst_of_failures_then_one_per_interval() -> None:
    clock = Clock()
    throttle = SignInThrottle(clock=clock)
    for _ in range(BURST):
        assert throttle.retry_after_s("a") == 0
        throttle.failed("a")
    assert throttle.retry_after_s("a") == pytest.approx(INTERVAL_S)
    assert throttle.retry_after_s("b") == 0  # other sources are not affected
    clock.now += INTERVAL_S - 1
    assert throttle.retry_after_s("a") == pytest.approx(1)
    clock.now += 1
    assert throttle.retry_after_s("a") == 0  # one more try...
    throttle.failed("a")
    assert throttle.retry_after_s("a") == pytest.approx(INTERVAL_S)  # ...and back to waiting
    clock.now += BURST * INTERVAL_S
    for _ in range(BURST):  # fully recovered: a whole burst again
        assert throttle.retry_after_s("a") == 0
        throttle.failed("a")
    assert throttle.retry_after_s("a") > 0


def test_one_audit_record_per_throttled_spell() -> None:
    clock = Clock()
    throttle = SignInThrottle(clock=clock, burst=1)
    throttle.failed("a")
    assert throttle.retry_after_s("a") > 0
    assert throttle.first_refusal("a")
    assert not throttle.first_refusal("a")
    clock.now += INTERVAL_S
    assert throttle.retry_after_s("a") == 0
    throttle.failed("a")
    assert throttle.retry_after_s("a") > 0
    assert throttle.first_refusal("a")
    assert not throttle.first_refusal("unknown")


def test_memory_stays_bounded_and_recovered_sources_go_first() -> None:
    clock = Clock()
    throttle = SignInThrottle(clock=clock, burst=2, max_sources=100)
    for _ in range(2):
        throttle.failed("attacker")
    for i in range(10_000):
        throttle.failed(f"10.0.{i // 256}.{i % 256}")
        assert len(throttle) <= 100
    # Nobody had recovered: the least recently refused made room, the attacker too.
    assert throttle.retry_after_s("attacker") == 0
    throttle.failed("attacker")
    throttle.failed("attacker")
    assert throttle.retry_after_s("attacker") > 0


def test_recovered_sources_make_room_before_a_throttled_one() -> None:
    clock = Clock()
    throttle = SignInThrottle(clock=clock, burst=2, max_sources=100)
    for _ in range(3):
        throttle.failed("attacker")  # the least recently refused from here on
    for i in range(99):
        throttle.failed(f"10.0.0.{i}")
    clock.now += INTERVAL_S  # the 99 have recovered, the attacker has not
    for i in range(99):
        throttle.failed(f"10.1.0.{i}")
    assert len(throttle) == 100
    assert throttle.retry_after_s("attacker") > 0


def test_sources_are_keyed_by_address_and_ipv6_by_64() -> None:
    assert source_key("192.0.2.7") == "192.0.2.7"
    assert source_key("::ffff:192.0.2.7") == "192.0.2.7"
    assert (
        source_key("2001:db8:1:2::1") == source_key("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    )
    assert source_key("2001:db8:1:3::1") != source_key("2001:db8:1:2::1")
    assert source_key(None) == "unknown"
    assert source_key("not-an-ip") == "not-an-ip"


@pytest.mark.integration
async def test_guessing_tokens_gets_a_429_and_one_audit_record(
    gateway: TestClient, token: Callable[..., str], settings: Settings
) -> None:
    good = token(sub="bob", scopes="approvals:read")
    for i in range(BURST):
        resp = await gateway.post(
            "/console/signin", data={"token": good + "x" * (i + 1)}, headers=origin(gateway)
        )
        assert resp.status == 401
    for attempt in (good + "y", good):  # now even the right token waits
        resp = await gateway.post(
            "/console/signin", data={"token": attempt}, headers=origin(gateway)
        )
        page = await resp.text()
        assert resp.status == 429, page
        assert 0 < int(resp.headers["Retry-After"]) <= INTERVAL_S
        assert "Too many attempts" in page and "try again in" in page
        assert "Set-Cookie" not in resp.headers
        assert "Content-Security-Policy" in resp.headers
    records = audit_records(settings)
    throttled = [r for r in records if r["type"] == "console.signin_throttled"]
    assert len(throttled) == 1 and throttled[0]["source_ip"] == "127.0.0.1"
    assert len([r for r in records if r["type"] == "console.signin_refused"]) == BURST
    assert all(good not in str(r) for r in records)
    # A cross-site post is refused as such, before the throttle is consulted or charged.
    resp = await gateway.post("/console/signin", data={"token": "x"})
    assert resp.status == 403


def test_a_refunded_attempt_costs_nothing() -> None:
    clock = Clock()
    throttle = SignInThrottle(clock=clock, burst=2)
    for _ in range(10):
        throttle.failed("a")
        throttle.refund("a")
    throttle.failed("a")
    assert throttle.retry_after_s("a") == 0  # one real failure so far: one more allowed
    throttle.refund("unknown")  # nothing to refund: no entry appears
    assert len(throttle) == 1


@pytest.mark.integration
async def test_concurrent_guesses_get_no_more_than_the_burst(
    gateway: TestClient, token: Callable[..., str]
) -> None:
    bad = token(sub="bob", scopes="approvals:read") + "x"

    async def guess() -> int:
        resp = await gateway.post("/console/signin", data={"token": bad}, headers=origin(gateway))
        return resp.status

    statuses = await asyncio.gather(*(guess() for _ in range(3 * BURST)))
    assert sorted(statuses) == [401] * BURST + [429] * (2 * BURST)


@pytest.mark.integration
async def test_good_sign_ins_never_run_the_budget_down(
    gateway: TestClient, token: Callable[..., str]
) -> None:
    good = token(sub="bob", scopes="approvals:read")
    for _ in range(3 * BURST):
        resp = await gateway.post(
            "/console/signin", data={"token": good}, headers=origin(gateway), allow_redirects=False
        )
        assert resp.status == 303
