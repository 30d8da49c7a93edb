"""backends/docker/sandbox.py's own checks (the container's life is test_lifecycle.py's)."""

from __future__ import annotations

import os

import pytest

from backends.base import BackendError
from backends.docker.sandbox import in_namespace
from backends.egress.netns import discard, enter, run_in_thread
from tests.backends.egress.test_boundary import require_root


def test_a_sandbox_in_the_namespace_made_for_it_passes() -> None:
    fd = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        in_namespace(os.getpid(), fd)
    finally:
        os.close(fd)


def test_a_sandbox_anywhere_else_is_refused() -> None:
    require_root()
    made = run_in_thread(lambda: enter(None))  # a namespace nobody is in
    assert made is not None
    try:
        with pytest.raises(BackendError, match="not in the network namespace"):
            in_namespace(os.getpid(), made)
        # A pid that names nobody (a gateway in another pid namespace sees others).
        with pytest.raises(BackendError, match="cannot see"):
            in_namespace(2**22 + 1, made)
    finally:
        discard([], made)
