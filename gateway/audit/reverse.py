"""Reading the audit log newest first: complete lines from the end backwards, in blocks.

The console's audit page wants the newest few records of a log that may hold
millions; reading forward costs the whole file, reading backwards costs only what
is shown (and, for an older page, what lies after it). Like the forward reader it
looks only at what was complete when it started: a final line without its newline
(being written now, or torn by a crash) is not a record, and bytes appended later
are not read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import BinaryIO

BLOCK = 64 * 1024


def lines_newest_first(
    f: BinaryIO, *, end: int | None = None, block_size: int = BLOCK
) -> Iterator[tuple[int, bytes]]:
    """(byte offset, line without newline) of every complete non-empty line before `end`
    (a line start; default: the end of the file), last first."""
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    size = f.seek(0, os.SEEK_END)
    pos = size if end is None else min(end, size)
    # The unfinished start of the line that continues into the blocks already read;
    # chunks (newest last) so a line longer than many blocks is joined once.
    carry: list[bytes] = []
    seen_newline = False
    while pos > 0:
        start = max(0, pos - block_size)
        f.seek(start)
        block = f.read(pos - start)
        pos = start
        newline = block.rfind(b"\n")
        if newline < 0:
            carry.append(block)
            continue
        data = block + b"".join(reversed(carry))
        carry = []
        parts = data.split(b"\n")
        end = start + len(data)
        if not seen_newline:
            # What follows the file's last newline is a torn or half-written line.
            end -= len(parts.pop()) + 1
            seen_newline = True
        for part in reversed(parts[1:]):
            offset = end - len(part)
            if part:
                yield offset, part
            end = offset - 1
        carry.append(parts[0])
    if seen_newline:
        first = b"".join(reversed(carry))
        if first:
            yield 0, first


def end_before_seq(f: BinaryIO, seq: int, *, block_size: int = BLOCK) -> int:
    """A line start at or after which every line's seq is >= `seq` (seq grows along the log).

    Bisection on byte offsets, so paging back into an old part of a large log does not
    read everything after it. Where a probed line is not a readable record (torn,
    damaged) it stops narrowing: the scan is then longer, never wrong.
    """
    lo, hi = 0, f.seek(0, os.SEEK_END)
    while hi - lo > block_size:
        start = _line_start_at_or_after(f, (lo + hi) // 2, block_size)
        line = _line_at(f, start, hi, block_size) if start < hi else None
        probed = _seq_of(line)
        if line is None or probed is None:
            break
        if probed < seq:
            lo = start + len(line) + 1
        else:
            hi = start
    return hi


def _line_start_at_or_after(f: BinaryIO, offset: int, block_size: int) -> int:
    if offset == 0:
        return 0
    f.seek(offset - 1)
    skipped = 0
    while block := f.read(block_size):
        index = block.find(b"\n")
        if index >= 0:
            return offset + skipped + index
        skipped += len(block)
    return offset + skipped


def _line_at(f: BinaryIO, start: int, limit: int, block_size: int) -> bytes | None:
    """The complete line starting at `start` and ending before `limit`, or None."""
    f.seek(start)
    chunks = []
    pos = start
    while pos < limit:
        block = f.read(min(block_size, limit - pos))
        if not block:
            break
        index = block.find(b"\n")
        if index >= 0:
            chunks.append(block[:index])
            return b"".join(chunks)
        chunks.append(block)
        pos += len(block)
    return None


def _seq_of(line: bytes | None) -> int | None:
    if not line:
        return None
    try:
        seq = json.loads(line).get("seq")
    except (ValueError, AttributeError):
        return None
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None
