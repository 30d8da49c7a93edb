"""The gVisor boundary: a namespace of the gateway's own, linked into its sinkhole."""

from __future__ import annotations

import os
import subprocess
import time

from backends.egress.veth import (
    FAR,
    GATEWAY_V4,
    LINK,
    SANDBOX_LINK_V4,
    open_veth_boundary,
)
from tests.backends.egress.test_boundary import require_root


def _path(fd: int) -> str:
    # How the runtime names it (deploy/docker/runsc-netns).
    return f"/proc/{os.getpid()}/fd/{fd}"


def _in(netns: str, *argv: str) -> str:
    done = subprocess.run(["nsenter", f"--net={netns}", *argv], capture_output=True, text=True)
    return done.stdout


def _ns(path: str) -> tuple[int, int]:
    seen = os.stat(path)
    return seen.st_dev, seen.st_ino


def test_the_sandbox_namespace_is_new_with_a_link_and_a_default_route() -> None:
    require_root()
    fds = open_veth_boundary()
    try:
        assert fds.sandbox is not None and fds.netns is not None
        sandbox = _path(fds.sandbox)
        assert os.readlink(sandbox).startswith("net:[")
        # Neither the gateway's namespace nor the sinkhole's.
        assert _ns(sandbox) not in {_ns("/proc/self/ns/net"), _ns(_path(fds.netns))}
        assert f"{SANDBOX_LINK_V4}/30" in _in(sandbox, "ip", "-4", "addr", "show", LINK)
        assert f"default via {GATEWAY_V4} dev {LINK}" in _in(sandbox, "ip", "route")
        # Loopback and the link, nothing else; the far end is in the sinkhole only.
        names = sorted(
            line.split(":")[1].strip().split("@")[0]
            for line in _in(sandbox, "ip", "-o", "link").splitlines()
        )
        assert names == sorted(["lo", LINK])
        assert FAR in _in(_path(fds.netns), "ip", "-o", "link")
        # The gateway's proxy and resolver listen on the link's far end, not on the host.
        assert fds.proxy.getsockname() == (GATEWAY_V4, 3128)
        assert fds.resolver.getsockname() == (GATEWAY_V4, 53)
        assert (
            LINK not in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        )
    finally:
        kept = os.open(_path(fds.sandbox), os.O_RDONLY) if fds.sandbox is not None else -1
        fds.close()
    try:
        # The sinkhole goes with its descriptors, and the link's sandbox end with it
        # (the namespace itself lives on here only because this test holds it).
        for _ in range(100):
            if LINK not in _in(_path(kept), "ip", "-o", "link"):
                break
            time.sleep(0.05)
        assert LINK not in _in(_path(kept), "ip", "-o", "link")
    finally:
        os.close(kept)


def test_boundaries_leave_no_descriptor_and_no_link_behind() -> None:
    require_root()
    before = set(os.listdir("/proc/self/fd"))
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    boundaries = [open_veth_boundary() for _ in range(10)]
    try:
        # A namespace of its own each time (all alive at once: a freed one's number
        # is given out again).
        assert len({_ns(_path(fds.sandbox or -1)) for fds in boundaries}) == 10
    finally:
        for fds in boundaries:
            fds.close()
    # listdir's own descriptor is gone again when it returns.
    assert set(os.listdir("/proc/self/fd")) == before
    assert subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout == links
