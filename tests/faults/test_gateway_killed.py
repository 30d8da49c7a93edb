"""The gateway SIGKILLed mid-execution: after a restart no orphan sandbox is left
(processes, cgroups, workspace directories of the dead instance), the audit chain
verifies, and a pending approval is still pending."""

from __future__ import annotations

import asyncio
import contextlib
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


def cgroups_under(parent: str) -> set[str]:
    """Execution cgroups (any controller) under the backend's cgroup parent."""
    found = set()
    for controller in Path("/sys/fs/cgroup").iterdir():
        directory = controller / parent.lstrip("/")
        if directory.is_dir():
            found |= {p.name for p in directory.iterdir() if p.is_dir()}
    return found


async def live_pids(uid: int, among: set[int], settle_s: float = 2.0) -> set[int]:
    """Those of `among` still running as `uid`, once a SIGKILL had time to land
    (a zombie holds nothing: it is dead, waiting for its parent to notice)."""
    deadline = time.monotonic() + settle_s
    while True:
        alive = set()
        for pid in among & {pid for pid, _ in processes_with_uid(uid)}:
            with contextlib.suppress(OSError):
                status = Path(f"/proc/{pid}/status").read_text()
                if "\nState:\tZ" not in status:
                    alive.add(pid)
        if not alive or time.monotonic() > deadline:
            return alive
        await asyncio.sleep(0.1)


def state_entries(state_dir: Path) -> set[str]:
    runs = state_dir / "runs"
    return {p.name for p in runs.iterdir()} if runs.is_dir() else set()


async def approval_status(gateway: ServedGateway, approval_id: str) -> str:
    headers = {"Authorization": f"Bearer {gateway.token()}"}
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{gateway.url}/v1/approvals/{approval_id}", headers=headers) as response,
    ):
        assert response.status == 200, await response.text()
        return (await response.json())["status"]


async def execution_record(
    gateway: ServedGateway, execution_id: str, tenant: str = "acme"
) -> tuple[int, str]:
    """GET /v1/executions/{id}: (HTTP status, record status or error code)."""
    headers = {"Authorization": f"Bearer {gateway.token(tenant=tenant)}"}
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{gateway.url}/v1/executions/{execution_id}", headers=headers) as response,
    ):
        body = await response.json()
        if response.status != 200:
            return response.status, body["error"]["code"]
        assert body["error"]["code"] == "execution_lost", body
        return response.status, body["status"]


async def test_sigkill_mid_execution_leaves_nothing_behind(
    tmp_path: Path,
    sandbox_ids: dict[str, str],  # noqa: F811
) -> None:
    require_root()
    ids = sandbox_ids
    uid = int(ids["EXECGATE_BACKENDS_NSJAIL_SANDBOX_UID"])
    parent = ids["EXECGATE_BACKENDS_NSJAIL_CGROUP_PARENT"]
    env = gateway_env(tmp_path, **ids)
    state_dir = Path(env["EXECGATE_BACKENDS_NSJAIL_STATE_DIR"])
    gateway = ServedGateway(env, tmp_path / "gateway.log").start()
    try:
        await gateway.wait_ready()
        status, held = await gateway.execute("import ctypes\nprint(ctypes.sizeof(ctypes.c_int))")
        assert status == 202 and held["status"] == "pending_approval", held
        running = asyncio.create_task(gateway.execute("import time; time.sleep(25)"))
        records = await gateway.wait_audit(
            lambda rs: any(r["type"] == "execution.started" for r in rs)
        )
        killed_start = next(r for r in records if r["type"] == "execution.started")
        killed = killed_start["execution_id"]
        await asyncio.sleep(0.5)  # the program is running in its sandbox
        orphans = {pid for pid, _ in processes_with_uid(uid)}
        old_cgroups = cgroups_under(parent)
        old_state = state_entries(state_dir)
        assert orphans and old_cgroups and old_state, "nothing was running: the test proves nothing"

        gateway.signal(signal.SIGKILL)
        await gateway.wait_exit(30)
        with pytest.raises(aiohttp.ClientError):
            await running

        gateway = ServedGateway(env, tmp_path / "gateway-2.log").start()
        await gateway.wait_ready()
        assert not await live_pids(uid, orphans), "sandbox processes of the dead gateway run on"
        assert not old_cgroups & cgroups_under(parent), "cgroups of the dead gateway remain"
        assert not old_state & state_entries(state_dir), "workspaces of the dead gateway remain"
        assert verify_file(env["EXECGATE_AUDIT_PATH"]).ok
        # The killed execution has an end, once, written before the new run's start...
        records = gateway.audit()
        ends = [
            r for r in records if r["execution_id"] == killed and r["seq"] > killed_start["seq"]
        ]
        assert [(r["type"], r["status"]) for r in ends] == [("execution.finished", "lost")], ends
        last_start = max(r["seq"] for r in records if r["type"] == "gateway.started")
        assert ends[0]["seq"] < last_start
        # ...and for GET, its tenant's only.
        assert await execution_record(gateway, killed, "beta") == (404, "not_found")
        assert await execution_record(gateway, killed) == (200, "failed")
        assert await approval_status(gateway, held["approval_id"]) == "pending"
        status, body = await gateway.execute("print('after the crash')")
        assert status == 200 and body["stdout"] == "after the crash\n"
    finally:
        gateway.stop()
