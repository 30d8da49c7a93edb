"""The decision inputs the gateway keeps, for `execgate policy replay` and `policy eval`.

Each decision's input and what was decided, masked by the decision-log mask
(policies/system/log.rego: no code, no secret-looking claims), in a SQLite file of
the gateway's state (`policy.inputs_path`), kept for `inputs_retention_days` and at
most `inputs_max_mb`; the oldest go first.

Off the request path: the decide stage hands each entry to `record()`, which only
queues it; a background task masks and writes batches on a worker thread (the mask's
pointers from the embedded engine when it answers them, else from rego-cpp). A full
queue drops the entry and counts it (`dropped`), since this record serves policy
testing and the audit log stays the record of what happened. Nothing unmasked is
ever written: an entry the mask fails on is dropped and counted too.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.files import make_private_dirs
from gateway.json_codec import dumps
from gateway.policy.base import LogMasker
from gateway.policy.mask import LogMask, MaskError
from gateway.settings.model import Settings

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS decision_inputs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    decision_id TEXT NOT NULL,
    execution_id TEXT,
    tenant TEXT,
    engine TEXT NOT NULL,
    revision TEXT,
    input TEXT NOT NULL,
    decided TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS decision_inputs_ts ON decision_inputs (ts);
CREATE INDEX IF NOT EXISTS decision_inputs_execution ON decision_inputs (execution_id);
"""

_QUEUE_MAX = 10_000
_BATCH_MAX = 256
# How long the writer lets entries gather before one transaction: a write per
# decision would take the GIL and the disk in the middle of the next request.
_LINGER_S = 0.05


@dataclass(frozen=True)
class KeptDecision:
    """One kept decision: its masked input and the summary of what was decided."""

    ts: float
    decision_id: str
    execution_id: str | None
    tenant: str | None
    engine: str
    revision: str | None
    input: dict[str, Any]
    decided: dict[str, Any]


def summary(
    allow: bool, deny: list[str], require_approval: bool, obligations: dict[str, Any]
) -> dict[str, Any]:
    """What replay compares: the decision's verdict and obligations."""
    return {
        "allow": allow,
        "deny": sorted(deny),
        "require_approval": require_approval,
        "obligations": obligations,
    }


def decision_inputs_path(settings: Settings) -> Path:
    if settings.policy.inputs_path:
        return Path(settings.policy.inputs_path)
    state = Path(settings.state.path) if settings.state.path else Path("var/state.db")
    return state.with_name("decision-inputs.db")


def _connect(path: Path) -> sqlite3.Connection:
    make_private_dirs(path.parent)
    # Owner-only before SQLite opens it (its -wal and -shm files take the same mode).
    os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600))
    os.chmod(path, 0o600)
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    # A replay aid, not the audit log: safe from a gateway crash without an fsync per
    # commit (only an OS crash may lose the last entries), so it does not queue behind
    # or ahead of the audit log's fsyncs on the same disk.
    db.execute("PRAGMA synchronous=NORMAL")
    db.executescript(_SCHEMA)
    return db


class DecisionInputLog:
    def __init__(
        self,
        path: Path,
        policy_dir: Path,
        retention_days: float,
        max_bytes: int,
        engine: str,
        masker: LogMasker | None = None,
    ) -> None:
        self._path = path
        # The decision engine, when it answers the mask itself (Wasm: ~0.1 ms on the
        # writer's thread, mostly without the GIL, where rego-cpp takes milliseconds).
        self._masker = masker
        self._policy_dir = policy_dir
        self._retention_s = retention_days * 86400
        self._max_bytes = max_bytes
        self._engine = engine
        self._queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(_QUEUE_MAX)
        self._task: asyncio.Task[None] | None = None
        self._db: sqlite3.Connection | None = None
        self._mask: LogMask | None = None
        self.dropped = 0
        self.written = 0

    async def start(self) -> None:
        # The mask comes from the policy directory; an OPA deployment's mask lives
        # in its bundle, which is this same tree.
        self._mask = await asyncio.to_thread(LogMask, self._policy_dir)
        self._db = await asyncio.to_thread(_connect, self._path)
        self._task = asyncio.create_task(self._drain(), name="decision-inputs")

    def record(
        self,
        decision_id: str,
        execution_id: str | None,
        policy_input: dict[str, Any],
        decided: dict[str, Any],
        revision: str | None,
    ) -> None:
        if self._queue.full():
            self.dropped += 1  # before the mask: no work for an entry that is not kept
            return
        entry = {
            "ts": time.time(),
            "decision_id": decision_id,
            "execution_id": execution_id,
            "input": policy_input,
            "decided": decided,
            "revision": revision,
        }
        self._queue.put_nowait(entry)  # not full: checked above, nothing awaited since

    async def flush(self) -> None:
        """Wait until everything queued so far is written (tests, shutdown)."""
        await self._queue.join()

    async def close(self) -> None:
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(self.flush(), 5)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._db is not None:
            self._db.close()

    async def _drain(self) -> None:
        while True:
            batch = [await self._queue.get()]
            if self._queue.qsize() < _BATCH_MAX:
                await asyncio.sleep(_LINGER_S)
            while len(batch) < _BATCH_MAX and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                await asyncio.to_thread(self._write, batch)
            except (sqlite3.Error, OSError) as exc:
                self.dropped += len(batch)
                log.warning("decision inputs not kept (%d): %s", len(batch), exc)
            finally:
                for _ in batch:
                    self._queue.task_done()

    def _write(self, batch: list[dict[str, Any]]) -> None:
        assert self._db is not None and self._mask is not None
        rows = []
        for entry in batch:
            document = {"input": entry["input"], "result": entry["decided"]}
            pointers = self._masker.mask_pointers(document) if self._masker else None
            try:
                masked = self._mask.apply(document, pointers)
            except MaskError as exc:
                self.dropped += 1
                log.warning("decision %s not kept: %s", entry["decision_id"], exc)
                continue
            tenant = (entry["input"].get("tenant") or {}).get("id")
            rows.append(
                (
                    entry["ts"],
                    entry["decision_id"],
                    entry["execution_id"],
                    tenant,
                    self._engine,
                    entry["revision"],
                    # orjson: this thread holds the GIL against the loop while it encodes.
                    dumps(masked["input"], sort_keys=True).decode("utf-8"),
                    dumps(entry["decided"], sort_keys=True).decode("utf-8"),
                )
            )
        with self._db:
            self._db.executemany(
                "INSERT INTO decision_inputs (ts, decision_id, execution_id, tenant, engine,"
                " revision, input, decided) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            self._db.execute(
                "DELETE FROM decision_inputs WHERE ts < ?", (time.time() - self._retention_s,)
            )
        self.written += len(rows)
        self._trim()

    def _trim(self) -> None:
        assert self._db is not None
        pages, size = (
            self._db.execute("PRAGMA page_count").fetchone()[0],
            self._db.execute("PRAGMA page_size").fetchone()[0],
        )
        free = self._db.execute("PRAGMA freelist_count").fetchone()[0]
        if (pages - free) * size <= self._max_bytes:
            return
        # Over the bound: the oldest tenth goes (freed pages are reused by later rows).
        count = self._db.execute("SELECT COUNT(*) FROM decision_inputs").fetchone()[0]
        self._db.execute(
            "DELETE FROM decision_inputs WHERE seq IN "
            "(SELECT seq FROM decision_inputs ORDER BY seq LIMIT ?)",
            (max(1, count // 10),),
        )


def read_kept(
    path: Path,
    since_s: float | None = None,
    tenant: str | None = None,
    execution_id: str | None = None,
) -> Iterator[KeptDecision]:
    """Kept decisions, oldest first (blocking; the CLI's reader)."""
    if not path.exists():
        return
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        sql = "SELECT ts, decision_id, execution_id, tenant, engine, revision, input, decided"
        sql += " FROM decision_inputs WHERE 1=1"
        args: list[Any] = []
        if since_s is not None:
            sql += " AND ts >= ?"
            args.append(time.time() - since_s)
        if tenant is not None:
            sql += " AND tenant = ?"
            args.append(tenant)
        if execution_id is not None:
            sql += " AND execution_id = ?"
            args.append(execution_id)
        for row in db.execute(sql + " ORDER BY seq", args):
            yield KeptDecision(
                ts=row[0],
                decision_id=row[1],
                execution_id=row[2],
                tenant=row[3],
                engine=row[4],
                revision=row[5],
                input=json.loads(row[6]),
                decided=json.loads(row[7]),
            )
    finally:
        db.close()
