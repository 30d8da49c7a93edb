"""Execution records for `GET /v1/executions/{id}` (with `?wait=` long-polling).

Recent records live in memory so a GET right after a POST never misses; every
finished record is also written to SQLite (`state.path`) on a dedicated thread, so
results outlive the process without a disk write on the request path.

Writes go in batches: what finished within PERSIST_LINGER_S goes in one transaction on
one thread hop. One hop and one commit per execution cost the gateway ~0.25 ms of CPU
each (GIL-bound, beside the request that follows). The audit log is the durable record
of every execution; the store is its readable copy, and close() writes everything
still waiting. What a SIGKILL can cost is the copy of results finished in its last
PERSIST_LINGER_S (their callers had their answers). A held execution, whose caller
comes back for the result later, is written at once when held and when it ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import sqlite3
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from gateway.context import rfc3339, utc_now
from gateway.files import make_private_dirs
from gateway.json_codec import dumps

log = logging.getLogger(__name__)

MEMORY_RECORDS = 10_000
# How long a finished record may wait for others to share its write, and how many
# one write takes at most.
PERSIST_LINGER_S = 0.02
PERSIST_BATCH_MAX = 256

_SCHEMA = """
CREATE TABLE IF NOT EXISTS executions (
    execution_id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    record TEXT NOT NULL
)
"""


class ExecutionStore:
    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._db: sqlite3.Connection | None = None
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="execgate-store")
        self._recent: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._done: dict[str, asyncio.Event] = {}
        self._writes: set[asyncio.Future[None]] = set()
        # Persisted, not yet handed to the thread: the latest version of each record.
        self._unwritten: dict[str, dict[str, Any]] = {}
        self._flush_timer: asyncio.TimerHandle | None = None
        self._held: set[str] = set()  # held for a person (now or before): written at once

    async def start(self) -> None:
        if self._path is not None:
            await self._call(self._open)

    def _open(self) -> None:
        assert self._path is not None
        make_private_dirs(self._path.parent)
        db = sqlite3.connect(self._path, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(_SCHEMA)
        db.commit()
        self._db = db

    async def _call(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def _remember(self, record: dict[str, Any]) -> None:
        self._recent[record["execution_id"]] = record
        self._recent.move_to_end(record["execution_id"])
        while len(self._recent) > MEMORY_RECORDS:
            self._recent.popitem(last=False)

    def started(self, execution_id: str, tenant: str) -> None:
        self._remember(
            {
                "execution_id": execution_id,
                "tenant": tenant,
                "status": "running",
                "created_at": rfc3339(utc_now()),
                "finished_at": None,
                "result": None,
                "error": None,
            }
        )
        self._done.setdefault(execution_id, asyncio.Event())

    def held(self, execution_id: str, tenant: str, approval: dict[str, Any]) -> None:
        """Waiting for a person: visible (and persisted) until decided or expired."""
        record = {
            "execution_id": execution_id,
            "tenant": tenant,
            "status": "pending_approval",
            "created_at": rfc3339(utc_now()),
            "finished_at": None,
            "result": None,
            "error": None,
            "approval": approval,
        }
        self._remember(record)
        self._done.setdefault(execution_id, asyncio.Event())
        self._held.add(execution_id)
        # A hold lasts minutes to hours and a restart must find it: not left to linger.
        self._persist(record, at_once=True)

    def finished(self, execution_id: str, result: dict[str, Any]) -> None:
        self._finish(execution_id, "done", result=result)

    def failed(self, execution_id: str, error: dict[str, Any]) -> None:
        self._finish(execution_id, "failed", error=error)

    def _finish(self, execution_id: str, status: str, **fields: Any) -> None:
        record = self._recent.get(execution_id)
        if record is None:
            return
        record.update(status=status, finished_at=rfc3339(utc_now()), **fields)
        event = self._done.pop(execution_id, None)
        if event is not None:
            event.set()
        # Held first: its caller comes back here for the result.
        at_once = execution_id in self._held
        self._held.discard(execution_id)
        self._persist(record, at_once)

    async def settle(self, execution_id: str, status: str, error: dict[str, Any]) -> None:
        """End a record that may only be on disk (held before a restart)."""
        if execution_id not in self._recent:
            record = await self._call(self._read, execution_id)
            if record is None:
                return
            self._remember(record)
        self._held.add(execution_id)  # ended by a person's decision, or its expiry
        self._finish(execution_id, status, error=error)

    async def lost(
        self, execution_id: str, tenant: str, created_at: str, error: dict[str, Any]
    ) -> None:
        """End, durably, a record a killed predecessor never finished (executions/recovery.py)."""
        self._flush()  # the read below comes after every write waiting (one thread, FIFO)
        record = await self._call(self._read, execution_id)
        if record is not None and record["status"] in ("done", "failed"):
            return  # its outcome is known
        record = record or {
            "execution_id": execution_id,
            "tenant": tenant,
            "created_at": created_at,
            "result": None,
        }
        record.update(status="failed", finished_at=rfc3339(utc_now()), error=error)
        self._remember(record)
        if self._db is not None:
            await self._call(self._write, record)

    def _persist(self, record: dict[str, Any], at_once: bool = False) -> None:
        if self._db is None:
            return
        self._unwritten[record["execution_id"]] = dict(record)  # as it is now
        if at_once or len(self._unwritten) >= PERSIST_BATCH_MAX:
            self._flush()
        elif self._flush_timer is None:
            self._flush_timer = asyncio.get_running_loop().call_later(PERSIST_LINGER_S, self._flush)

    def _flush(self) -> None:
        """Hand what waits to the thread, in one write."""
        if self._flush_timer is not None:
            self._flush_timer.cancel()
            self._flush_timer = None
        if not self._unwritten or self._db is None:
            return
        batch, self._unwritten = list(self._unwritten.values()), {}
        fut = asyncio.ensure_future(self._call(self._write, *batch))
        self._writes.add(fut)
        fut.add_done_callback(self._written)

    def _written(self, fut: asyncio.Future[None]) -> None:
        self._writes.discard(fut)
        if not fut.cancelled() and fut.exception() is not None:
            # The audit log still holds every execution; only GET after a restart misses.
            log.error("execution records not stored: %s", fut.exception())

    def _write(self, *records: dict[str, Any]) -> None:
        assert self._db is not None
        with self._db:  # one transaction
            self._db.executemany(
                "INSERT OR REPLACE INTO executions (execution_id, tenant, record) VALUES (?, ?, ?)",
                [(r["execution_id"], r["tenant"], dumps(r).decode("utf-8")) for r in records],
            )

    def _read(self, execution_id: str) -> dict[str, Any] | None:
        if self._db is None:
            return None
        row = self._db.execute(
            "SELECT record FROM executions WHERE execution_id = ?", (execution_id,)
        ).fetchone()
        return json.loads(row[0]) if row else None

    async def get(self, execution_id: str, wait_s: float = 0.0) -> dict[str, Any] | None:
        record = self._recent.get(execution_id) or self._unwritten.get(execution_id)
        if record is None:
            record = await self._call(self._read, execution_id)
            if record is None or record["status"] != "pending_approval":
                return record
            # Held before a restart: bring it back so a decision can wake this waiter.
            record = self._recent.setdefault(execution_id, record)
            self._held.add(execution_id)
            self._done.setdefault(execution_id, asyncio.Event())
        event = self._done.get(execution_id)
        if wait_s > 0 and event is not None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), timeout=wait_s)
            # A held record is replaced when its execution starts: read it again.
            record = self._recent.get(execution_id, record)
        return record

    async def close(self) -> None:
        self._flush()
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)
        if self._db is not None:
            await self._call(self._db.close)
            self._db = None
        self._thread.shutdown(wait=True)
