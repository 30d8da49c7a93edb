"""Graceful shutdown of a real `execgate serve`: SIGTERM stops accepting, lets running
executions finish within server.shutdown_grace_s, kills the rest (audited as such),
and flushes the audit log before the process exits 0."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path

import aiohttp
import pytest

from gateway.audit.chain import verify_file
from tests.backends.conftest import processes_with_uid
from tests.gateway.conftest import require_root
from tests.gateway.served import ServedGateway, gateway_env, sandbox_ids  # noqa: F401

pytestmark = pytest.mark.integration


async def refuses_connections(url: str, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(url + "/healthz"):
                    pass
            except aiohttp.ClientConnectorError:
                return True
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    return False


async def test_sigterm_drains_kills_the_rest_and_flushes(
    tmp_path: Path,
    sandbox_ids: dict[str, str],  # noqa: F811
) -> None:
    require_root()
    ids = sandbox_ids
    env = gateway_env(
        tmp_path, EXECGATE_SERVER_SHUTDOWN_GRACE_S="2", EXECGATE_SERVER_LOG_FORMAT="json", **ids
    )
    gateway = ServedGateway(env, tmp_path / "gateway.log").start()
    try:
        await gateway.wait_ready()
        short = asyncio.create_task(
            gateway.execute("import time; time.sleep(0.5); print('finished in grace')")
        )
        # Policy caps it at 5 s: the 2 s grace ends first.
        long = asyncio.create_task(gateway.execute("import time; time.sleep(25)"))
        started = await gateway.wait_audit(
            lambda rs: sum(r["type"] == "execution.started" for r in rs) == 2
        )
        gateway.signal(signal.SIGTERM)

        assert await refuses_connections(gateway.url), "still accepting after SIGTERM"
        status, body = await short
        assert status == 200 and body["stdout"] == "finished in grace\n", body
        [long_id] = [
            r["execution_id"]
            for r in started
            if r["type"] == "execution.started" and r["execution_id"] != body["execution_id"]
        ]
        with pytest.raises(aiohttp.ClientError):
            await long  # cancelled at the deadline: the connection closes unanswered
        assert await gateway.wait_exit(30) == 0
    finally:
        gateway.stop()

    records = gateway.audit()
    assert verify_file(env["EXECGATE_AUDIT_PATH"]).ok
    finished = {r["execution_id"]: r for r in records if r["type"] == "execution.finished"}
    assert finished[long_id]["status"] == "cancelled"
    assert "shutting down" in finished[long_id]["reason"]
    assert records[-1]["type"] == "gateway.stopped"
    assert processes_with_uid(int(ids["EXECGATE_BACKENDS_NSJAIL_SANDBOX_UID"])) == []
    # Every line it logged is JSON.
    for line in gateway.log.read_text().splitlines():
        assert isinstance(json.loads(line), dict), line
