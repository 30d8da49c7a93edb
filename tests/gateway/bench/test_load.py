"""`execgate load`, scaled down: limits hold, nothing 5xx, nothing unaudited or leaked."""

from __future__ import annotations

import pytest

from gateway.bench.load import run_load
from tests.gateway.conftest import require_root

pytestmark = pytest.mark.integration


async def test_a_small_load_run_holds_every_promise() -> None:
    require_root()
    report = await run_load(requests=300, concurrency=32, max_seconds=600)
    assert report["problems"] == [], report
    assert report["status_5xx"] == 0 and report["status_429"] > 0
    assert all(t["within_limit"] for t in report["tenants"]), report["tenants"]
    by_name = {t["tenant"]: t for t in report["tenants"]}
    assert by_name["narrow"]["limited"].get("concurrency", 0) > 0
    assert by_name["bursty"]["ok"] <= 100 + report["elapsed_s"] + 1
