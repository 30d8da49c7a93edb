"""The boundary refuses the gateway's own namespace, and leaves nothing behind."""

from __future__ import annotations

import os
import subprocess

import pytest

from backends.egress.boundary import TUN_NAME, BoundaryError, open_boundary
from tests.components import missing_component


def require_root() -> None:
    if os.geteuid() != 0:
        missing_component("network namespaces need root")


def test_the_gateways_own_namespace_is_refused() -> None:
    require_root()
    before = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    with pytest.raises(BoundaryError, match="own network namespace"):
        open_boundary("/proc/self/ns/net")
    after = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert after == before and TUN_NAME not in after


def test_a_new_namespace_is_named_nowhere() -> None:
    require_root()
    named = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    fds = open_boundary()
    assert fds.netns is not None
    assert os.readlink(f"/proc/self/fd/{fds.netns}") != os.readlink("/proc/self/ns/net")
    fds.close()
    assert subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout == named
