"""The execution store: records readable at once, written to SQLite in batches, and
nothing lost at close."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gateway.executions import store as store_module
from gateway.executions.store import PERSIST_BATCH_MAX, ExecutionStore


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "state.db"


@pytest.fixture
async def store(db: Path) -> AsyncIterator[ExecutionStore]:
    """A started store on `db`, closed afterwards (a test may close it first)."""
    opened = ExecutionStore(db)
    await opened.start()
    try:
        yield opened
    finally:
        await opened.close()


def _stored(db: Path) -> dict[str, str]:
    conn = sqlite3.connect(db)
    try:
        return dict(conn.execute("SELECT execution_id, record FROM executions"))
    finally:
        conn.close()


async def _after_restart(db: Path, execution_id: str) -> dict[str, Any] | None:
    """The record as a new store on the same file reads it."""
    again = ExecutionStore(db)
    await again.start()
    try:
        return await again.get(execution_id)
    finally:
        await again.close()


def _finish(store: ExecutionStore, execution_id: str, stdout: str = "1\n") -> None:
    store.started(execution_id, "acme")
    store.finished(execution_id, {"stdout": stdout})


async def test_a_finished_record_is_readable_at_once_and_on_disk_after_the_linger(
    db: Path, store: ExecutionStore
) -> None:
    _finish(store, "exe_1")
    record = await store.get("exe_1")
    assert record is not None and record["status"] == "done"
    # Not yet written: it waits for others to share its transaction...
    assert _stored(db) == {}
    await asyncio.sleep(store_module.PERSIST_LINGER_S * 4)
    # ...and goes without any further record arriving.
    assert set(_stored(db)) == {"exe_1"}


async def test_records_finished_together_share_one_write(db: Path, store: ExecutionStore) -> None:
    writes: list[int] = []
    write = store._write

    def counting(*records: dict[str, object]) -> None:
        writes.append(len(records))
        write(*records)

    store._write = counting  # type: ignore[method-assign]
    for i in range(10):
        _finish(store, f"exe_{i}")
    await asyncio.sleep(store_module.PERSIST_LINGER_S * 4)
    assert writes == [10]
    # A full batch does not wait for the linger.
    for i in range(PERSIST_BATCH_MAX):
        _finish(store, f"big_{i}")
    assert not store._unwritten and store._writes  # handed over without the linger
    await asyncio.gather(*store._writes)
    assert writes == [10, PERSIST_BATCH_MAX]
    assert len(_stored(db)) == 10 + PERSIST_BATCH_MAX


async def test_close_writes_what_is_still_waiting_and_a_restart_reads_it(
    db: Path, store: ExecutionStore
) -> None:
    _finish(store, "exe_1", stdout="é\udcff")  # not valid UTF-8 as given: stored anyway
    store.held("exe_2", "acme", {"approval_id": "apr_1"})
    await store.close()

    first = await _after_restart(db, "exe_1")
    assert first is not None and first["status"] == "done"
    assert first["result"]["stdout"].startswith("é")
    held = await _after_restart(db, "exe_2")
    assert held is not None and held["status"] == "pending_approval"


async def test_the_latest_version_of_a_record_is_the_one_stored(
    db: Path, store: ExecutionStore
) -> None:
    store.held("exe_1", "acme", {"approval_id": "apr_1"})
    store.started("exe_1", "acme")
    store.failed("exe_1", {"code": "x", "message": "y"})
    await store.close()
    record = await _after_restart(db, "exe_1")
    assert record is not None and record["status"] == "failed"


async def test_a_failed_write_is_logged_not_raised(store: ExecutionStore, caplog: object) -> None:
    def broken(*records: dict[str, object]) -> None:
        raise sqlite3.OperationalError("disk I/O error")

    store._write = broken  # type: ignore[method-assign]
    _finish(store, "exe_1")
    await store.close()  # does not raise
    assert "execution records not stored" in caplog.text  # type: ignore[attr-defined]


async def test_a_held_record_is_written_without_waiting_for_the_linger(
    db: Path, store: ExecutionStore
) -> None:
    store.held("exe_1", "acme", {"approval_id": "apr_1"})
    assert not store._unwritten  # handed over without the linger
    await asyncio.gather(*store._writes)
    assert set(_stored(db)) == {"exe_1"}


async def test_a_held_execution_s_result_is_written_at_once_when_it_ends(
    db: Path, store: ExecutionStore
) -> None:
    store.held("exe_1", "acme", {"approval_id": "apr_1"})
    store.started("exe_1", "acme")  # approved: the hold's record is replaced
    store.finished("exe_1", {"stdout": "1\n"})
    assert "exe_1" not in store._unwritten  # handed over without the linger
    _finish(store, "exe_2")
    assert "exe_2" in store._unwritten  # never held: waits for the linger
    await asyncio.gather(*store._writes)
    assert '"status":"done"' in _stored(db)["exe_1"]
