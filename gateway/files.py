"""Small file-system helpers shared by the gateway's own state (keys, audit, store)."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def make_private_dirs(directory: Path) -> None:
    """Create `directory` and any missing parents with mode 0700 (never wider)."""
    missing = []
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
            os.chmod(path, 0o700)  # umask may have narrowed mkdir's mode


def create_private_file(path: Path, content: bytes) -> bool:
    """Write `content` to a new file `path` (0600) atomically; False if it already existed.

    When two processes race to create it, one wins and the other keeps the winner's
    file: callers read `path` back afterwards rather than trusting `content`.
    """
    make_private_dirs(path.parent)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, content)
        os.fsync(fd)
    finally:
        os.close(fd)
    try:
        # link() fails if another process created the file meanwhile.
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink()
