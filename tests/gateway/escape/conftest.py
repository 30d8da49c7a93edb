"""Real backends for the escape suite, and weakened ones that only tests can build."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.nsjail.settings import NsjailSettings
from tests.backends.conftest import NO_CAPTURE, require_root


@pytest.fixture
def escape_state_dir() -> Iterator[Path]:
    # Under /tmp, not pytest's 0700 tmp_path: the sandbox uid traverses to it.
    path = Path(tempfile.mkdtemp(prefix="execgate-escape-test-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def escape_nsjail_settings(escape_state_dir: Path) -> NsjailSettings:
    require_root()
    # A uid of this test process's own: the residue check sees only our sandboxes.
    uid = 150000 + os.getpid() % 9000
    # Capture off for the weakened backends; the full runs (test_runner.py) turn it on.
    return NsjailSettings(
        state_dir=str(escape_state_dir), sandbox_uid=uid, sandbox_gid=uid, capture=NO_CAPTURE
    )
