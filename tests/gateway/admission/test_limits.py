from backends.base import Limits
from gateway.admission.limits import clamp
from gateway.settings.model import TenantSettings


def test_lowest_of_request_obligation_tenant_and_backend() -> None:
    tenant = TenantSettings(timeout_s=30, memory_mb=512, pids=64)
    backend = Limits(
        timeout_s=60, memory_mb=4096, cpus=4, pids=32, disk_mb=1024, output_bytes=1 << 20
    )
    got = clamp(
        {"timeout_s": 100, "memory_mb": 256}, {"memory_mb": 128, "cpus": None}, tenant, backend
    )
    assert got.timeout_s == 30  # tenant ceiling
    assert got.memory_mb == 128  # obligation
    assert got.pids == 32  # backend capability
    assert got.cpus == 1.0  # default, within everything


def test_request_for_nothing_gets_defaults() -> None:
    got = clamp(
        {},
        {},
        TenantSettings(),
        Limits(
            timeout_s=3600,
            memory_mb=65536,
            cpus=64,
            pids=65536,
            disk_mb=65536,
            output_bytes=1 << 30,
        ),
    )
    assert got == Limits()
