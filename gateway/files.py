"""Small file-system helpers shared by the gateway's own state (keys, audit, store)."""

from __future__ import annotations

import contextlib
import os
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
