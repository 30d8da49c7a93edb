"""The audit log file itself: opening it, finding where it ends, appending batches.

Everything here blocks (file I/O, fsync): `gateway.audit` runs it in a thread.
Finding the end reads backwards from the end in blocks, so start-up costs the
size of the last record, not of the file.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.audit.chain import GENESIS_HASH, seal, self_check
from gateway.audit.read import decode_line
from gateway.files import make_private_dirs


class AuditUnavailable(Exception):
    """The record could not be made durable; nothing it describes may proceed."""


class AuditCorrupt(AuditUnavailable):
    """The existing file does not end in a valid record; the chain cannot be resumed."""


class WriteFailed(Exception):
    def __init__(self, cause: OSError, *, permanent: bool) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.permanent = permanent


@dataclass(frozen=True, slots=True)
class TornTail:
    length: int
    sha256: str
    preview: bytes  # the first PREVIEW_BYTES of it


@dataclass(frozen=True, slots=True)
class LogTail:
    seq: int  # seq of the last complete record (0 for an empty log)
    last_hash: str  # its hash (GENESIS_HASH for an empty log)
    size: int  # bytes up to and including the last complete line's newline
    torn: TornTail | None  # what followed it: an incomplete final line, now cut off


def open_log(path: Path) -> tuple[int, LogTail]:
    """Open (creating 0600 in 0700 dirs), lock, and cut an incomplete final line off."""
    make_private_dirs(path.parent)
    created = not path.exists()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise AuditUnavailable(f"audit log {path} is in use by another process") from None
        if created:
            fsync_dir(path.parent)
        try:
            tail = scan_tail(fd)
        except ValueError as exc:
            raise AuditCorrupt(
                f"audit log {path}: {exc}; not appending to it "
                f"(inspect it with `execgate audit verify {path}`)"
            ) from None
        if tail.torn is not None:
            os.ftruncate(fd, tail.size)
            os.fsync(fd)
    except BaseException:
        os.close(fd)  # also drops the lock
        raise
    return fd, tail


def write_batch(
    fd: int,
    records: list[dict[str, Any]],
    seq: int,
    prev_hash: str,
    offset: int,
    fsync: Callable[[int], None],
) -> tuple[str, int]:
    """Chain `records` on after (`seq`, `prev_hash`), write and fsync them at once.

    Returns the new last hash and file size. On failure the file is cut back to
    `offset` (WriteFailed.permanent says whether that, or the fsync, failed too).
    """
    lines = []
    for record in records:
        seq += 1
        record["seq"] = seq
        _, line = seal(record, prev_hash)
        prev_hash = record["hash"]
        lines.append(line)
    data = memoryview(b"".join(lines))
    end = offset + len(data)
    try:
        while data:
            written = os.write(fd, data)
            data = data[written:]
    except OSError as exc:
        try:
            # Cut the partial batch so the file still ends in a whole record.
            os.ftruncate(fd, offset)
            fsync(fd)
        except OSError:
            raise WriteFailed(exc, permanent=True) from exc
        raise WriteFailed(exc, permanent=False) from exc
    try:
        fsync(fd)
    except OSError as exc:
        # After a failed fsync the page cache state is unknown: stop writing.
        raise WriteFailed(exc, permanent=True) from exc
    return prev_hash, end


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- finding the end -------------------------------------------------------------

_BLOCK = 64 * 1024
PREVIEW_BYTES = 4096


def scan_tail(fd: int) -> LogTail:
    """Locate the last complete record of the file open on `fd` (blocking).

    Raises ValueError when the last complete line is not a valid record.
    """
    size = os.fstat(fd).st_size
    end = _last_newline_before(fd, size)
    if end < 0:
        return LogTail(0, GENESIS_HASH, 0, _torn(fd, 0, size))
    torn = _torn(fd, end + 1, size)
    start = _last_newline_before(fd, end) + 1
    raw = _read(fd, start, end - start)
    try:
        record = decode_line(raw)
    except ValueError as exc:
        raise ValueError(f"last complete line (byte {start}) is unreadable: {exc}") from None
    problem = self_check(record)
    if problem:
        raise ValueError(f"last complete line (byte {start}) is not a valid record: {problem}")
    return LogTail(record["seq"], record["hash"], end + 1, torn)


def _torn(fd: int, start: int, size: int) -> TornTail | None:
    if start >= size:
        return None
    digest = hashlib.sha256()
    for offset in range(start, size, _BLOCK):
        digest.update(_read(fd, offset, min(_BLOCK, size - offset)))
    preview = _read(fd, start, min(PREVIEW_BYTES, size - start))
    return TornTail(size - start, digest.hexdigest(), preview)


def _last_newline_before(fd: int, limit: int) -> int:
    """Offset of the last b"\\n" in [0, limit), or -1."""
    pos = limit
    while pos > 0:
        start = max(0, pos - _BLOCK)
        block = _read(fd, start, pos - start)
        index = block.rfind(b"\n")
        if index >= 0:
            return start + index
        pos = start
    return -1


def _read(fd: int, offset: int, length: int) -> bytes:
    chunks = []
    while length > 0:
        chunk = os.pread(fd, length, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
        length -= len(chunk)
    return b"".join(chunks)
