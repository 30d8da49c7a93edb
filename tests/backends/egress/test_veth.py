"""The gVisor boundary: a link from a holder's namespace into the gateway's sinkhole."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest

from backends.egress.boundary import BoundaryError
from backends.egress.veth import GATEWAY_V4, LINK, SANDBOX_LINK_V4, open_veth_boundary
from tests.backends.egress.test_boundary import require_root


@pytest.fixture
def holder() -> Iterator[int]:
    """A process in a namespace of its own, with loopback only (like a holder container)."""
    require_root()
    proc = subprocess.Popen(["unshare", "--net", "sleep", "60"])
    try:
        for _ in range(100):
            if _netns(proc.pid) != _netns("self"):
                break
            time.sleep(0.05)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def _netns(pid: int | str) -> str:
    return subprocess.run(
        ["readlink", f"/proc/{pid}/ns/net"], capture_output=True, text=True
    ).stdout


def _in(pid: int, *argv: str) -> str:
    done = subprocess.run(
        ["nsenter", f"--net=/proc/{pid}/ns/net", *argv], capture_output=True, text=True
    )
    return done.stdout


def test_the_holder_gets_a_link_and_a_default_route(holder: int) -> None:
    fds = open_veth_boundary(holder)
    try:
        assert f"{SANDBOX_LINK_V4}/30" in _in(holder, "ip", "-4", "addr", "show", LINK)
        assert f"default via {GATEWAY_V4} dev {LINK}" in _in(holder, "ip", "route")
        # The gateway's proxy and resolver listen on the link's far end, not on the host.
        assert fds.proxy.getsockname() == (GATEWAY_V4, 3128)
        assert fds.resolver.getsockname() == (GATEWAY_V4, 53)
    finally:
        fds.close()
    # The sinkhole goes with its descriptors, and the link's holder end with it.
    for _ in range(100):
        if LINK not in _in(holder, "ip", "-o", "link"):
            break
        time.sleep(0.05)
    assert LINK not in _in(holder, "ip", "-o", "link")


def test_the_gateways_own_namespace_is_refused() -> None:
    require_root()
    before = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    with pytest.raises(BoundaryError, match="own network namespace"):
        open_veth_boundary(os.getpid())
    after = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert after == before and LINK not in after
