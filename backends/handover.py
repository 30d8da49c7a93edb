"""Hand-over of code to an interpreter started before the code existed.

A sandbox made ahead starts its interpreter at once, on the code file's usual
path (`python3 -I /code/main.py`), where a FIFO stands in for the file. The
interpreter does its whole start-up (loading itself, its standard library,
site) and then blocks opening or reading the FIFO. When a request claims the
sandbox, its code is staged as a regular file beside the FIFO; at hand-over
the regular file is renamed over the FIFO's path and the same bytes are
written into the FIFO, which is then closed. The interpreter reads its
program from the FIFO to EOF and runs it as its `__main__`, under its own
file name, its usual `sys.argv` and exit handling; anything that opens the
path afterwards (tracebacks' source lines, `cat $0`) finds the regular file.

Every interleaving ends with the program's own bytes: an interpreter that
had not yet reached the path when it was renamed opens the regular file, as
it would have cold; the FIFO's write end is opened (read-write, so it never
blocks and never sees EPIPE) before the rename, so one that opened the FIFO
first has a writer and waits for the bytes; the pipe is sized to hold them
where the kernel allows (pipe-max-size, 1 MiB by default, binds a gateway
without CAP_SYS_RESOURCE), and what does not fit is written as the
interpreter reads, off the event loop's critical path.

One difference is Python's: its reader cannot switch to a declared source
encoding (PEP 263) on a FIFO ("encoding problem"), so Python code declaring
one is handed over already decoded, as UTF-8 with the declaration naming
utf-8 on the same line, which is what a cold interpreter would have compiled.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import fcntl
import io
import os
import re
import stat
import tokenize
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# A pipe holds 64 KiB unless resized; the gateway (root) may size it past
# /proc/sys/fs/pipe-max-size.
DEFAULT_PIPE_BYTES = 1 << 16
COOKIE = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")
UTF8 = frozenset({"utf-8", "utf-8-sig"})


class HandoverError(OSError):
    """The code could not be staged or handed over."""


def place_fifo(path: Path) -> None:
    """The stand-in for the code file, readable by the sandbox user."""
    os.mkfifo(path, 0o600)
    os.chmod(path, 0o644)  # past the umask; only the gateway (root) writes


def is_fifo(path: Path) -> bool:
    try:
        return stat.S_ISFIFO(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


def python_source(code: bytes) -> bytes:
    """What a Python interpreter reading from a FIFO must get to compile what it
    would have compiled from the file: the code as is, unless it declares a
    source encoding other than UTF-8 (then decoded, and re-declared utf-8)."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(code).readline)
        if codecs.lookup(encoding).name in UTF8:
            return code
        text = code.decode(encoding)
    except (SyntaxError, LookupError, UnicodeDecodeError):
        # The interpreter refuses it too (a SyntaxError either way; the message
        # names an "encoding problem" where a cold one would name the codec).
        return code
    lines = text.encode("utf-8").splitlines(keepends=True)
    for i in range(min(2, len(lines))):
        if match := COOKIE.match(lines[i]):
            lines[i] = lines[i][: match.start(1)] + b"utf-8" + lines[i][match.end(1) :]
            return b"".join(lines)
    return code  # detect_encoding found a cookie: not reached


@dataclass(slots=True)
class Staged:
    """Code ready to be handed over: the regular file beside the FIFO and the
    FIFO's write end (non-blocking), opened before the rename."""

    staged_path: Path
    path: Path
    fd: int
    payload: bytes

    def deliver(self) -> Coroutine[Any, Any, None] | None:
        """Rename the code file into place and feed the interpreter what its pipe
        holds (quick: tmpfs and a pipe, no waiting); what did not fit is left to
        the coroutine returned, which writes as the interpreter reads."""
        try:
            os.rename(self.staged_path, self.path)
            view = memoryview(self.payload)
            while view:
                try:
                    view = view[os.write(self.fd, view) :]
                except BlockingIOError:
                    return self._feed(view)
        except BaseException:
            self.close()
            raise
        self.close()
        return None

    async def _feed(self, view: memoryview) -> None:
        loop = asyncio.get_running_loop()
        try:
            while view:
                try:
                    view = view[os.write(self.fd, view) :]
                except BlockingIOError:
                    room = loop.create_future()
                    loop.add_writer(self.fd, room.set_result, None)
                    try:
                        await room
                    finally:
                        loop.remove_writer(self.fd)
        finally:
            # Also when cancelled: an interpreter that opened the regular file
            # instead never reads the pipe.
            self.close()

    def close(self) -> None:
        """Close the write end (the interpreter reads EOF) and drop the staged file
        if it was never handed over."""
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.staged_path)


def hand_over_nothing(path: Path, write: Callable[[Path, bytes], None]) -> None:
    """Let an interpreter waiting at `path` go with an empty program (it exits 0,
    and nsjail reaps it): how a sandbox never used is wound down without a kill."""
    if is_fifo(path):  # else handed over already
        stage(path, b"", b"", write).deliver()


def stage(path: Path, code: bytes, payload: bytes, write: Callable[[Path, bytes], None]) -> Staged:
    """Write the code beside the FIFO at `path` (with `write(path, bytes)`), open
    the FIFO's write end and size its pipe for `payload` (as far as allowed)."""
    staged_path = path.with_name(f".{path.name}.staged")
    write(staged_path, code)
    try:
        fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        os.unlink(staged_path)
        raise
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            raise HandoverError(f"{path} is not the sandbox's FIFO")
    except OSError:
        os.close(fd)
        os.unlink(staged_path)
        raise
    if len(payload) > DEFAULT_PIPE_BYTES:
        _size_pipe(fd, len(payload))
    return Staged(staged_path=staged_path, path=path, fd=fd, payload=payload)


def _size_pipe(fd: int, size: int) -> None:
    # The kernel rounds up to a power of two pages; past pipe-max-size it needs
    # CAP_SYS_RESOURCE. A pipe left smaller is fed as it is read.
    for want in (size, _pipe_max_bytes()):
        try:
            fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, min(want, size))
            return
        except OSError:
            continue


def _pipe_max_bytes() -> int:
    try:
        return int(Path("/proc/sys/fs/pipe-max-size").read_text())
    except (OSError, ValueError):
        return DEFAULT_PIPE_BYTES
