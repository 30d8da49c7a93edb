"""Reading the audit log: filtered queries (`GET /v1/audit`) and `tail` (`execgate audit tail`).

Readers never lock the file and only ever look at complete lines, so they can
run beside the writer. They do not verify the chain (`verify_file` does); a line
that does not parse is skipped with a warning.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from os import PathLike
from typing import Any, BinaryIO

from gateway.audit.reverse import end_before_seq, lines_newest_first

log = logging.getLogger(__name__)

_CHUNK = 64 * 1024


def decode_line(raw: bytes) -> dict[str, Any]:
    """Parse one line (without its newline) into a record; ValueError says what is wrong."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 ({exc.reason} at byte {exc.start})") from None
    try:
        record = json.loads(text, parse_constant=_not_json)
    except ValueError as exc:
        raise ValueError(f"bad JSON: {exc}") from None
    if not isinstance(record, dict):
        raise ValueError("bad JSON: not an object")
    return record


def _not_json(name: str) -> Any:
    # The stdlib reads NaN and Infinity; no canonical line holds them.
    raise ValueError(f"{name} is not JSON")


def normalise_since(value: str | datetime | None) -> str | None:
    """`since` as a record timestamp string (they compare in time order); ValueError if bad."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        text = value.strip()
        if text[-1:] in ("Z", "z"):
            text = text[:-1] + "+00:00"
        try:
            value = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"since: not an RFC 3339 timestamp: {value!r}") from None
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class AuditFilter:
    type: str | None = None
    tenant: str | None = None
    execution_id: str | None = None
    since: str | None = None  # from normalise_since
    after_seq: int = 0
    before_seq: int = 0  # 0: no bound
    until: str | None = None  # from normalise_since
    # Review records (execution.review) that flagged something, at this severity.
    flagged: bool = False
    severity: str | None = None
    # Behaviour records (execution.behaviour) with at least one attempt of this kind:
    # files, programs, signals or syscalls_refused.
    attempt: str | None = None

    def matches(self, record: dict[str, Any]) -> bool:
        return (
            self._behaviour_matches(record)
            and (self.type is None or record.get("type") == self.type)
            and (self.tenant is None or record.get("tenant") == self.tenant)
            and (self.execution_id is None or record.get("execution_id") == self.execution_id)
            and (self.since is None or str(record.get("ts", "")) >= self.since)
            and (self.until is None or str(record.get("ts", "")) <= self.until)
            and (not self.after_seq or _seq(record) > self.after_seq)
            and (not self.before_seq or _seq(record) < self.before_seq)
        )

    def _behaviour_matches(self, record: dict[str, Any]) -> bool:
        if self.flagged or self.severity is not None:
            flags = record.get("flags")
            if not isinstance(flags, list) or not flags:
                return False
            if self.severity is not None and not any(
                isinstance(f, dict) and f.get("severity") == self.severity for f in flags
            ):
                return False
        return self.attempt is None or bool(record.get(self.attempt))

    def needles(self) -> list[bytes]:
        """Byte strings every matching line contains (lines are canonical JSON)."""
        out = []
        for key in ("type", "tenant", "execution_id"):
            value = getattr(self, key)
            if value is not None:
                out.append(f'"{key}":{json.dumps(value, ensure_ascii=False)}'.encode())
        if self.flagged or self.severity is not None:
            out.append(b'"flags":[{')
        return out


def _seq(record: dict[str, Any]) -> int:
    seq = record.get("seq")
    return seq if isinstance(seq, int) else 0


def _records(
    lines: Iterator[tuple[int, bytes]], filt: AuditFilter, where: str = "line"
) -> Iterator[dict[str, Any]]:
    needles = filt.needles()
    for lineno, raw in lines:
        if any(needle not in raw for needle in needles):
            continue
        try:
            record = decode_line(raw)
        except ValueError as exc:
            log.warning("audit log %s %d skipped: %s", where, lineno, exc)
            continue
        if filt.matches(record):
            yield record


def _complete_lines(f: BinaryIO) -> Iterator[tuple[int, bytes]]:
    """Complete lines (without newline) from the current position; stops at EOF."""
    for lineno, raw in enumerate(f, start=1):
        if not raw.endswith(b"\n"):
            return  # being written right now, or torn: not a record yet
        yield lineno, raw[:-1]


def query_sync(
    path: str | PathLike[str],
    filt: AuditFilter,
    *,
    limit: int,
    newest: bool = False,
    descending: bool = False,
) -> list[dict[str, Any]]:
    """Up to `limit` matching records: the first ones in seq order; with `newest`, the last
    ones (read backwards from the end), in seq order, or newest first with `descending`."""
    if limit <= 0:
        raise ValueError("limit must be positive")
    try:
        f = open(path, "rb")  # noqa: SIM115 - closed below, after the generator is done
    except FileNotFoundError:
        return []
    with f:
        if newest or descending:
            end = end_before_seq(f, filt.before_seq) if filt.before_seq else None
            records = _records(lines_newest_first(f, end=end), filt, where="byte")
        else:
            records = _records(_complete_lines(f), filt)
        out = list(itertools.islice(records, limit))
    return out[::-1] if newest and not descending else out


async def query(
    path: str | PathLike[str],
    *,
    tenant: str | None = None,
    type: str | None = None,
    since: str | datetime | None = None,
    execution_id: str | None = None,
    after_seq: int = 0,
    before_seq: int = 0,
    until: str | datetime | None = None,
    limit: int = 100,
    newest: bool = False,
    descending: bool = False,
    flagged: bool = False,
    severity: str | None = None,
    attempt: str | None = None,
) -> list[dict[str, Any]]:
    """Records for `GET /v1/audit`; reads the file in a thread. ValueError for a bad time.

    Page forward with `after_seq` = the last seq of the previous page; newest first
    (`descending`) page back with `before_seq` = the last seq of the previous page.
    """
    filt = AuditFilter(
        type,
        tenant,
        execution_id,
        normalise_since(since),
        after_seq,
        before_seq,
        normalise_since(until),
        flagged,
        severity,
        attempt,
    )
    return await asyncio.to_thread(
        query_sync, path, filt, limit=limit, newest=newest, descending=descending
    )


def tail(
    path: str | PathLike[str],
    *,
    follow: bool = False,
    type: str | None = None,
    tenant: str | None = None,
    execution_id: str | None = None,
    since: str | datetime | None = None,
    last: int | None = None,
    poll_interval_s: float = 0.25,
    stop: Callable[[], bool] | None = None,
) -> Iterator[dict[str, Any]]:
    """Matching records (the `last` N only, if given); with `follow`, then new ones as written.

    Blocking generator for the CLI. Following survives the file not existing yet,
    being replaced (new inode) or truncated: it starts over from the new file's
    beginning. `stop` is polled while waiting; returning True ends the iteration.
    """
    filt = AuditFilter(type, tenant, execution_id, normalise_since(since))
    follower = _Follower(path)
    try:
        existing = _records(follower.read_lines(), filt)
        if last is not None:
            existing = iter(deque(existing, maxlen=max(0, last)))
        yield from existing
        while follow and not (stop is not None and stop()):
            time.sleep(poll_interval_s)
            yield from _records(follower.read_lines(), filt)
    finally:
        follower.close()


class _Follower:
    """Reads complete lines of a growing file, across replacement and truncation."""

    def __init__(self, path: str | PathLike[str]) -> None:
        self.path = path
        self._file: BinaryIO | None = None
        self._inode: int | None = None
        self._buffer = b""
        self._lineno = 0

    def read_lines(self) -> Iterator[tuple[int, bytes]]:
        self._reopen_if_replaced()
        if self._file is None:
            return
        while chunk := self._file.read(_CHUNK):
            self._buffer += chunk
            *lines, self._buffer = self._buffer.split(b"\n")
            for line in lines:
                self._lineno += 1
                yield self._lineno, line

    def _reopen_if_replaced(self) -> None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return
        if self._file is not None:
            position = self._file.tell()
            if st.st_ino == self._inode and st.st_size >= position:
                return
            self.close()
        self._file = open(self.path, "rb")  # noqa: SIM115 - kept open while following
        self._inode = os.fstat(self._file.fileno()).st_ino
        self._buffer, self._lineno = b"", 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
