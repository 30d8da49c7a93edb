"""The boundary refuses the gateway's own namespace, and leaves nothing behind."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from typing import TypeVar

import pytest

from backends.egress.boundary import TUN_NAME, BoundaryError, open_boundary
from backends.egress.netns import enable_ipv6, enter, run_in_thread, set_sysctls
from tests.components import missing_component

T = TypeVar("T")


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


def _in_new_namespace(work: Callable[[], T]) -> T:
    """`work`'s answer, run on a thread of its own in a new network namespace."""

    def inside() -> T:
        fd = enter(None)
        try:
            return work()
        finally:
            if fd is not None:
                os.close(fd)

    return run_in_thread(inside)


def _read(key: str) -> str:
    with open(f"/proc/sys/net/{key}") as f:
        return f.read().strip()


def test_a_sysctl_already_set_is_not_written() -> None:
    # A read-only key: a write would fail, so passing proves it was only read.
    require_root()
    key = "ipv4/tcp_available_congestion_control"

    def work() -> tuple[bool, type[BaseException] | None]:
        kept = set_sysctls({key: _read(key)})
        try:
            set_sysctls({key: "not-" + _read(key)})
        except OSError as exc:
            return kept, type(exc)
        return kept, None

    kept, refused = _in_new_namespace(work)
    assert kept is True
    assert refused is not None and issubclass(refused, OSError)


def test_a_missing_sysctl_says_so() -> None:
    require_root()
    assert _in_new_namespace(lambda: set_sysctls({"ipv4/no_such_key": "1"})) is False


@pytest.mark.parametrize("off", [(), ("all",), ("default",), ("lo",), ("all", "default", "lo")])
def test_ipv6_is_turned_on_whatever_of_it_was_off(off: tuple[str, ...]) -> None:
    """Each scope that was off (a container's `none` network turns some off) is on
    afterwards, the ones already on are left alone, and the answer says it is on."""
    require_root()

    def work() -> tuple[bool, dict[str, str]]:
        if not os.path.exists("/proc/sys/net/ipv6"):
            missing_component("this kernel has no IPv6")
        for scope in off:
            with open(f"/proc/sys/net/ipv6/conf/{scope}/disable_ipv6", "w") as f:
                f.write("1")
        on = enable_ipv6()
        states = {s: _read(f"ipv6/conf/{s}/disable_ipv6") for s in ("all", "default", "lo")}
        return on, states

    on, states = _in_new_namespace(work)
    assert on is True
    assert states == {"all": "0", "default": "0", "lo": "0"}


def test_the_gateways_own_sysctls_are_untouched() -> None:
    require_root()
    before = {s: _read(f"ipv6/conf/{s}/disable_ipv6") for s in ("all", "default", "lo")}

    def work() -> None:
        for scope in ("all", "default", "lo"):
            with open(f"/proc/sys/net/ipv6/conf/{scope}/disable_ipv6", "w") as f:
                f.write("1")
        enable_ipv6()

    _in_new_namespace(work)
    assert {s: _read(f"ipv6/conf/{s}/disable_ipv6") for s in ("all", "default", "lo")} == before
