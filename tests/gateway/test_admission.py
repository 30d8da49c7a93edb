import pytest

from gateway.admission import Admission
from gateway.errors import GatewayError
from gateway.settings import TenantSettings


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_burst_then_rate() -> None:
    clock = Clock()
    adm = Admission(clock)
    limits = TenantSettings(rate_per_s=2, burst=3, max_concurrent=100)
    for _ in range(3):
        adm.admit("t", limits).release()
    with pytest.raises(GatewayError) as exc:
        adm.admit("t", limits)
    assert exc.value.code == "rate_limited"
    assert int(exc.value.headers["Retry-After"]) >= 1
    assert "RateLimit" in exc.value.headers and "RateLimit-Policy" in exc.value.headers
    clock.now += 0.5
    adm.admit("t", limits).release()


def test_tenants_do_not_share_rate() -> None:
    adm = Admission(Clock())
    limits = TenantSettings(rate_per_s=1, burst=1)
    adm.admit("a", limits).release()
    adm.admit("b", limits).release()
    with pytest.raises(GatewayError):
        adm.admit("a", limits)


def test_concurrency_slots_and_idempotent_release() -> None:
    adm = Admission(Clock())
    limits = TenantSettings(rate_per_s=1000, burst=1000, max_concurrent=2)
    one, two = adm.admit("t", limits), adm.admit("t", limits)
    with pytest.raises(GatewayError, match="concurrent"):
        adm.admit("t", limits)
    one.release()
    one.release()
    assert adm.usage("t")["concurrent"] == 1
    adm.admit("t", limits)
    two.release()


def test_cpu_quota_over_a_rolling_hour() -> None:
    clock = Clock()
    adm = Admission(clock)
    limits = TenantSettings(rate_per_s=1000, burst=1000, cpu_s_per_hour=10)
    adm.charge_cpu("t", 10.5)
    with pytest.raises(GatewayError) as exc:
        adm.admit("t", limits)
    assert exc.value.code == "quota_exceeded"
    clock.now += 3601
    assert adm.usage("t")["cpu_s_last_hour"] == 0
    adm.admit("t", limits).release()
