"""Recovery at start-up: executions a killed run started and never finished get an end,
once, read from the audit log backwards to the last run boundary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gateway.audit.chain import verify_file
from gateway.audit.log import AuditLog
from gateway.executions.recovery import LOST_REASON, recover, unfinished_sync
from gateway.executions.store import ExecutionStore


def ids(execution_id: str, tenant: str = "acme") -> dict[str, Any]:
    return {"request_id": f"req_{execution_id}", "execution_id": execution_id, "tenant": tenant}


async def write(path: Path, *records: tuple[str, dict[str, Any]]) -> None:
    """Records appended by a real AuditLog (a run that then dies: no close record)."""
    audit = AuditLog(path)
    await audit.start()
    for type_, fields in records:
        await audit.append(type_, **fields)
    await audit.close()


def started(execution_id: str, tenant: str = "acme") -> tuple[str, dict[str, Any]]:
    return "execution.started", {**ids(execution_id, tenant), "backend": "nsjail"}


def finished(execution_id: str) -> tuple[str, dict[str, Any]]:
    return "execution.finished", {**ids(execution_id), "status": "ok"}


RUN = ("gateway.started", {})
STOP = ("gateway.stopped", {"reason": "shutdown"})


@pytest.mark.parametrize("block_bytes", [97, 65536])
async def test_finds_what_the_last_run_left_running(tmp_path: Path, block_bytes: int) -> None:
    path = tmp_path / "audit.jsonl"
    await write(
        path,
        RUN,
        started("old"),
        finished("old"),
        STOP,
        RUN,
        started("a"),
        started("b"),
        finished("b"),
        started("c"),
        ("request.rejected", {**ids("c"), "code": "backend_unavailable"}),
        started("d", tenant="beta"),
        ("gateway.start_failed", {"error": "opa down"}),  # a failed start after the crash
    )
    lost = unfinished_sync(path, block_bytes)
    assert [(r["execution_id"], r["tenant"]) for r in lost] == [("a", "acme"), ("d", "beta")]


async def test_a_clean_stop_in_between_leaves_nothing_to_recover(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    # Started and never finished, but a clean stop (and a start) came after it.
    await write(path, RUN, started("a"), STOP)
    assert unfinished_sync(path) == []
    await write(path, RUN, started("b"), RUN)
    assert unfinished_sync(path) == []
    assert unfinished_sync(tmp_path / "missing.jsonl") == []


async def test_recover_ends_each_once_in_the_log_and_the_store(tmp_path: Path) -> None:
    path, db = tmp_path / "audit.jsonl", tmp_path / "state.db"
    store = ExecutionStore(db)
    await store.start()
    # "held": held, approved and started; "plain": started straight away.
    store.held("held", "acme", {"approval_id": "apr_1"})
    await store.close()
    await write(path, RUN, started("held"), started("plain"), started("done"), finished("done"))

    for _ in range(2):  # the second restart finds nothing more to do
        audit, store = AuditLog(path), ExecutionStore(db)
        await audit.start()
        await store.start()
        try:
            await recover(audit, store)
        finally:
            await store.close()
            await audit.close()

    records = [r for r in _records(path) if r["type"] == "execution.finished"]
    lost = [r for r in records if r["status"] == "lost"]
    assert [r["execution_id"] for r in lost] == ["held", "plain"]
    assert all(r["reason"] == LOST_REASON and r["backend"] == "nsjail" for r in lost)
    assert lost[0]["tenant"] == "acme" and lost[0]["request_id"] == "req_held"
    assert verify_file(path).ok

    store = ExecutionStore(db)
    await store.start()
    try:
        for execution_id in ("held", "plain"):
            record = await store.get(execution_id)
            assert record is not None and record["tenant"] == "acme"
            assert record["status"] == "failed" and record["finished_at"]
            assert record["error"] == {"code": "execution_lost", "message": LOST_REASON}
        assert (await store.get("held"))["approval"] == {"approval_id": "apr_1"}  # type: ignore[index]
        assert await store.get("done") is None  # ended in the log: not touched
    finally:
        await store.close()


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]
