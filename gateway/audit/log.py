"""The audit log writer: hash-chained JSON Lines, durable before `append` returns.

File format and hashing: see `gateway.audit.chain`.

Durability and group commit. `append` queues a record and waits; one writer task
takes everything queued, gives the records their `seq`/`prev_hash`/`hash`, writes
them with one `write` and one `fsync` (in a thread, never on the event loop) and
only then resolves the waiting `append`s. Records appended while an fsync runs
share the next one, so the number of fsyncs follows the disk, not the load.
`flush_interval_ms` is an optional extra: when the previous batch held the records
of more than one request (the log is busy), the next batch starts no sooner than that long
after it, trading latency for fewer fsyncs on IOPS-limited disks. A lone
appender never waits. 0 turns it off.

Failures. If a write fails (disk full, I/O error) the partial write is cut off
again, the affected `append`s raise `AuditUnavailable` and `healthy` turns False.
The writer retries every `retry_interval_s` (and with every new append); the
first successful write starts with an `audit.write_failed` record counting the
refused records, and makes the log healthy again. A failed
`fsync` (the kernel may have dropped the dirty pages) or a failed cut-off makes
the failure permanent until restart: nothing more is written to that file.

Restart. `start` resumes the chain from the last record. A final line without
its newline can only be a write that was never acknowledged (a crash mid-write):
it is cut off and an `audit.recovered` record says so, with the length, SHA-256
and first bytes of what was removed. A last complete line that is not a valid,
self-consistent record is never repaired: `start` raises `AuditCorrupt`. An
exclusive `flock` keeps a second process from appending to the same file.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gateway.audit.chain import CONTEXT_FIELDS, GENESIS_HASH, RESERVED_FIELDS
from gateway.audit.file import (
    AuditCorrupt,
    AuditUnavailable,
    TornTail,
    WriteFailed,
    open_log,
    write_batch,
)
from gateway.audit.values import jsonable

__all__ = ["AuditCorrupt", "AuditLog", "AuditUnavailable", "utc_timestamp"]

log = logging.getLogger(__name__)


# The longest a `queue`d record waits for a batch to go with.
QUEUE_WAIT_S = 0.005


def utc_timestamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class AuditLog:
    def __init__(
        self,
        path: Path,
        flush_interval_ms: float = 2.0,
        *,
        fsync: Callable[[int], None] = os.fsync,
        retry_interval_s: float = 1.0,
    ) -> None:
        self.path = Path(path)
        self._interval_s = max(0.0, flush_interval_ms) / 1000.0
        # Injectable so tests can count and order fsyncs; production uses os.fsync.
        self._fsync = fsync
        self._fd: int | None = None
        self._seq = 0
        self._last_hash = GENESIS_HASH
        self._offset = 0  # durable end of the file
        self._pending: list[tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]] = []
        self._wakeup = asyncio.Event()
        self._queue_timer: asyncio.TimerHandle | None = None  # a `queue`d record's limit
        self._writer: asyncio.Task[None] | None = None
        # A thread of the log's own for write+fsync: in the shared default executor a
        # batch would queue behind sandbox set-up jobs, and every request waits for it.
        self._thread: concurrent.futures.ThreadPoolExecutor | None = None
        self._closing = False
        self._error: str | None = None  # last write failure, cleared by a success
        self._broken: str | None = None  # permanent failure
        self._retry_s = retry_interval_s
        self._lost_records = 0  # refused since the last successful write
        self._lost_since: str | None = None
        self._last_batch_at = -1e9
        self._last_batch_requests = 0
        self.fsyncs = 0
        self.batches = 0
        self.records_written = 0
        # Called after each durable batch with its records and write+fsync seconds
        # (metrics); an observer must not raise or block.
        self.observers: list[Callable[[list[dict[str, Any]], float], None]] = []

    # --- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        if self._fd is not None:
            raise RuntimeError("audit log already started")
        self._fd, tail = await asyncio.to_thread(open_log, self.path)
        self._seq, self._last_hash, self._offset = tail.seq, tail.last_hash, tail.size
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="audit-writer")
        self._writer = asyncio.create_task(self._run(), name="audit-writer")
        if tail.torn is not None:
            try:
                await self._record_recovery(tail.size, tail.torn)
            except BaseException:
                await self.close()
                raise

    async def _record_recovery(self, offset: int, torn: TornTail) -> None:
        log.warning(
            "audit log %s ended in an incomplete line (%d bytes at offset %d): cut off",
            self.path,
            torn.length,
            offset,
        )
        await self.append(
            "audit.recovered",
            reason="incomplete final line from an interrupted write was cut off",
            offset=offset,
            truncated_bytes=torn.length,
            truncated_sha256=torn.sha256,
            truncated_preview=torn.preview,  # bytes: stored as base64
        )

    async def close(self) -> None:
        """Write everything queued, then close the file. Appends after this fail."""
        self._closing = True
        self._wakeup.set()
        if self._queue_timer is not None:
            self._queue_timer.cancel()
            self._queue_timer = None
        if self._writer is not None:
            # A writer that died has already failed every append and logged why.
            await asyncio.gather(self._writer, return_exceptions=True)
            self._writer = None
        if self._thread is not None:
            # A write still in flight (a cancelled writer) finishes before the fd goes.
            await asyncio.to_thread(self._thread.shutdown, True)
            self._thread = None
        if self._fd is not None:
            os.close(self._fd)  # also drops the flock
            self._fd = None

    @property
    def healthy(self) -> bool:
        return (
            self._fd is not None
            and not self._closing
            and self._error is None
            and self._broken is None
        )

    @property
    def problem(self) -> str | None:
        """Why the log is unhealthy, for /readyz and logs."""
        if self._fd is None or self._closing:
            return "audit log is not open"
        return self._broken or self._error

    @property
    def last_seq(self) -> int:
        return self._seq

    @property
    def last_hash(self) -> str:
        return self._last_hash

    # --- appending -------------------------------------------------------------

    async def append(self, type: str, **fields: Any) -> dict[str, Any]:
        """Append one record; return it (with seq and hash) once it is on disk.

        `request_id`, `execution_id`, `tenant` and `subject` default to None.
        Raises TypeError/ValueError for fields that cannot be JSON (nothing is
        written) and AuditUnavailable when the record could not be made durable.
        """
        return await self.submit(type, **fields)

    def submit(self, type: str, **fields: Any) -> asyncio.Future[dict[str, Any]]:
        """Queue a record now; the future resolves as `append` would return.

        For stages that record as they go and wait once: records get their seq
        in submission order, so gather every future before sending the response
        the records describe. Field errors raise here, synchronously.
        """
        future = self._enqueue(type, fields)
        self._wakeup.set()
        return future

    def _enqueue(self, type: str, fields: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
        if self._fd is None or self._closing:
            raise AuditUnavailable(f"audit log {self.path} is not open")
        if self._broken is not None:
            raise AuditUnavailable(self._broken)
        if not isinstance(type, str) or not type:
            raise ValueError("audit record type must be a non-empty string")
        clash = RESERVED_FIELDS.intersection(fields)
        if clash:
            raise ValueError(f"audit fields may not be named {sorted(clash)}")
        record: dict[str, Any] = {"ts": utc_timestamp(), "type": type}
        for name in CONTEXT_FIELDS:
            record[name] = None
        record.update(jsonable(fields))
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        # A submitter that never awaits must not trigger "exception never retrieved".
        future.add_done_callback(_mark_retrieved)
        self._pending.append((record, future))
        return future

    def queue(self, type: str, **fields: Any) -> asyncio.Future[dict[str, Any]]:
        """`submit` without starting a batch for it: the record goes to disk with
        the next record submitted (or `kick`), in one write and one fsync with it,
        and after QUEUE_WAIT_S at the latest. For a record the request waits for
        later with others (`policy.decided` before `execution.started`): woken for
        it alone, the writer would start an fsync the next record then waits out."""
        future = self._enqueue(type, fields)
        if self._queue_timer is None:
            self._queue_timer = asyncio.get_running_loop().call_later(
                QUEUE_WAIT_S, self._wakeup.set
            )
        return future

    def kick(self) -> None:
        """Start a batch for what `queue` left waiting (before awaiting it)."""
        if self._pending:
            self._wakeup.set()

    async def _run(self) -> None:
        try:
            while True:
                await self._wait_for_work()
                if self._pending or self._lost_records:
                    if self._last_batch_requests > 1:
                        # Busy: gather more per fsync. A lone appender never waits.
                        gap = self._last_batch_at + self._interval_s - time.monotonic()
                        if gap > 0:
                            await asyncio.sleep(gap)
                    batch, self._pending = self._pending, []
                    if self._queue_timer is not None:  # what it waited for goes now
                        self._queue_timer.cancel()
                        self._queue_timer = None
                    lost = self._lost_records
                    if lost:
                        batch.insert(0, self._loss_note())
                    self._last_batch_at = time.monotonic()
                    # Requests, not records: one request's records go together (`queue`).
                    self._last_batch_requests = len({r.get("request_id") for r, _ in batch})
                    if await self._flush(batch):
                        self._lost_records, self._lost_since = 0, None
                    elif self._broken is None:
                        refused = batch[1:] if lost else batch
                        if refused and self._lost_since is None:
                            self._lost_since = refused[0][0]["ts"]
                        self._lost_records += len(refused)
                if self._closing and not self._pending:
                    return
        except BaseException as exc:
            # Never leave an append waiting forever, whatever went wrong.
            self._broken = f"audit writer stopped: {exc!r}"
            if not isinstance(exc, asyncio.CancelledError):
                log.exception("audit writer stopped")
            self._fail(self._pending, self._broken)
            self._pending = []
            raise

    async def _wait_for_work(self) -> None:
        if self._lost_records and self._broken is None and not self._closing:
            # Retry on our own: a gateway that stopped admitting work never appends again.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), self._retry_s)
        else:
            await self._wakeup.wait()
        self._wakeup.clear()

    def _loss_note(self) -> tuple[dict[str, Any], asyncio.Future[dict[str, Any]]]:
        """First record after a write failure: how many records were refused, since when."""
        record: dict[str, Any] = {"ts": utc_timestamp(), "type": "audit.write_failed"}
        record.update(dict.fromkeys(CONTEXT_FIELDS))
        record.update(error=self._error, lost_records=self._lost_records, since=self._lost_since)
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_mark_retrieved)
        return record, future

    async def _flush(self, batch: list[tuple[dict[str, Any], asyncio.Future[Any]]]) -> bool:
        if self._broken is not None:
            self._fail(batch, self._broken)
            return False
        records = [record for record, _ in batch]
        assert self._fd is not None  # the writer runs only between start and close
        began = time.perf_counter()
        try:
            last_hash, offset = await asyncio.get_running_loop().run_in_executor(
                self._thread,
                write_batch,
                self._fd,
                records,
                self._seq,
                self._last_hash,
                self._offset,
                self._fsync,
            )
        except WriteFailed as exc:
            message = f"audit log {self.path} write failed: {exc.cause.strerror or exc.cause}"
            if exc.permanent:
                self._broken = message + " (permanent until restart)"
            self._error = message
            log.error("%s", self._broken or message)
            self._fail(batch, self._broken or message)
            return False
        self._seq += len(records)
        self._last_hash, self._offset = last_hash, offset
        self._error = None
        self.fsyncs += 1
        self.batches += 1
        self.records_written += len(records)
        for observe in self.observers:
            observe(records, time.perf_counter() - began)
        for record, future in batch:
            if not future.done():
                future.set_result(record)
        return True

    @staticmethod
    def _fail(batch: list[tuple[dict[str, Any], asyncio.Future[Any]]], message: str) -> None:
        for _, future in batch:
            if not future.done():
                future.set_exception(AuditUnavailable(message))


def _mark_retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
