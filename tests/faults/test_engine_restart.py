"""The Docker engine dies and comes back mid-execution: the execution ends in a clean
503 backend_unavailable, no container of the gateway is left behind once the engine is
back, and executions work again without restarting the gateway.

This restarts the host's shared engine (SIGKILL, then deploy/docker/start-dockerd.sh,
as a supervisor would): it is marked `engine_restart` and runs at the very end of the
session (tests/faults/conftest.py). Run it alone with `pytest -m engine_restart`."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gateway.audit.chain import verify_file
from tests.components import missing_component
from tests.gateway.conftest import REPO, require_root
from tests.gateway.served import ServedGateway, gateway_env

pytestmark = [pytest.mark.integration, pytest.mark.engine_restart]

PIDFILE = Path("/var/run/docker.pid")


def engine_answers() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


def containers_of(gateway_pid: int) -> list[dict[str, str]]:
    listed = subprocess.run(
        ["docker", "ps", "-a", "--filter", f"label=execgate.pid={gateway_pid}",
         "--format", "{{json .}}"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return [json.loads(line) for line in listed.stdout.splitlines()]


async def start_engine() -> None:
    started = await asyncio.to_thread(
        subprocess.run, ["bash", str(REPO / "deploy/docker/start-dockerd.sh")],
        capture_output=True, text=True,
    )  # fmt: skip
    assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]


async def crash_and_restart_engine() -> None:
    pid = int(PIDFILE.read_text())
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, "dockerd did not die"
        await asyncio.sleep(0.05)
    # A crashed dockerd leaves its pid file; if another process got that pid meanwhile
    # (pids wrap fast on a busy host), the new dockerd would refuse to start.
    if PIDFILE.exists() and PIDFILE.read_text().strip() == str(pid):
        PIDFILE.unlink()
    await asyncio.sleep(1.0)  # the gateway sees the engine gone before it is back
    await start_engine()


async def test_engine_restart_mid_execution(tmp_path: Path) -> None:
    require_root()
    if shutil.which("docker") is None or not engine_answers() or not PIDFILE.exists():
        missing_component("a Docker engine started by deploy/docker/start-dockerd.sh")
    env = gateway_env(
        tmp_path,
        EXECGATE_BACKENDS_DEFAULT="docker",
        EXECGATE_BACKENDS_DOCKER_POOL_SIZE="1",
        EXECGATE_BACKENDS_DOCKER_REAP_INTERVAL_S="1",
    )
    gateway = ServedGateway(env, tmp_path / "gateway.log").start()
    try:
        await gateway.wait_ready(120)
        assert gateway.proc is not None
        running = asyncio.create_task(gateway.execute("import time; time.sleep(25)", timeout_s=90))
        started = await gateway.wait_audit(
            lambda rs: any(r["type"] == "execution.started" for r in rs)
        )
        execution_id = next(r for r in started if r["type"] == "execution.started")["execution_id"]
        await asyncio.sleep(0.5)
        await crash_and_restart_engine()

        status, body = await running
        assert status == 503 and body["error"]["code"] == "backend_unavailable", body

        # The engine is back: executions work again (a pool container that died with the
        # engine is noticed and replaced when next taken).
        status, body = await gateway.execute("print('engine is back')", timeout_s=90)
        assert status == 200 and body["stdout"] == "engine is back\n", body

        # Nothing of this gateway is left but running containers of its pool: the failed
        # execution's container and the dead ones are removed (disposal or the reaper).
        deadline = time.monotonic() + 60
        while True:
            leftovers = [
                c for c in containers_of(gateway.proc.pid)
                if execution_id in c.get("Labels", "") or c["State"] != "running"
            ]  # fmt: skip
            if not leftovers:
                break
            assert time.monotonic() < deadline, f"containers left behind: {leftovers}"
            await asyncio.sleep(0.5)
        pid = gateway.proc.pid
    finally:
        gateway.stop()
        if not engine_answers():  # never leave the host's shared engine down
            await start_engine()
    assert containers_of(pid) == [], "a stopped gateway leaves no container"
    assert verify_file(env["EXECGATE_AUDIT_PATH"]).ok
    finished = [r for r in gateway.audit() if r.get("code") == "backend_unavailable"]
    assert finished and finished[0]["execution_id"] == execution_id
