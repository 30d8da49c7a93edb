"""rtnetlink requests leave a namespace exactly as the iproute2 commands they replace.

Differential: two fresh namespaces, one configured by `ip -batch` with the commands
the boundaries used to run, one by `RouteSocket`; iproute2's own JSON view of their
links, addresses and routes must be the same. Then the refusals: each names its step.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from backends.egress.boundary import SANDBOX_V4, SANDBOX_V6, TUN_NAME, configure_tun
from backends.egress.netns import discard, enter, open_tun, run_in_thread
from backends.egress.rtnl import IFF_RUNNING, RouteSocket
from backends.egress.veth import (
    FAR,
    GATEWAY_V4,
    GATEWAY_V6,
    LINK,
    SANDBOX_LINK_V4,
    SANDBOX_LINK_V6,
)
from tests.backends.egress.test_boundary import require_root

IPROUTE2_TUN = f"""link set lo up
link set dev {TUN_NAME} addrgenmode none
link set dev {TUN_NAME} up
addr add {SANDBOX_V4}/32 dev {TUN_NAME}
route add default dev {TUN_NAME}
addr add {SANDBOX_V6}/128 dev {TUN_NAME} nodad
route add ::/0 dev {TUN_NAME}
"""
# Fields that differ between any two namespaces however they were configured: indices,
# random MAC addresses (and the link-local addresses made from them), lifetimes, and
# what the kernel settles a moment later (operational state, duplicate detection).
VOLATILE = {"ifindex", "link_index", "address", "broadcast", "stats64", "valid_life_time",
            "preferred_life_time", "link_netnsid", "operstate", "tentative"}  # fmt: skip


@pytest.fixture
def holder() -> Iterator[int]:
    """A process in a network namespace of its own, with loopback only."""
    require_root()
    proc = subprocess.Popen(["unshare", "--net", "sleep", "60"])
    own = os.stat("/proc/self/ns/net").st_ino
    try:
        for _ in range(100):
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{proc.pid}/ns/net").st_ino != own:
                    break
            time.sleep(0.05)
        yield proc.pid
    finally:
        proc.kill()
        proc.wait()


def ip_batch(batch: str) -> None:
    subprocess.run(["ip", "-batch", "-"], input=batch.encode(), check=True, capture_output=True)


def view() -> dict[str, Any]:
    """iproute2's view of the calling thread's namespace (its child starts there)."""

    def dump(*argv: str) -> Any:
        out = subprocess.run(["ip", "-j", *argv], check=True, capture_output=True, text=True)
        return _scrub(json.loads(out.stdout or "[]"))

    return {
        "links": dump("-d", "link", "show"),
        "addresses": dump("addr", "show"),
        "routes4": dump("-4", "route", "show", "table", "all"),
        "routes6": dump("-6", "route", "show", "table", "all"),
    }


def _scrub(value: Any) -> Any:
    if isinstance(value, dict):
        if value.get("scope") == "link" and str(value.get("local", "")).startswith("fe80:"):
            value = {**value, "local": "fe80::(from the MAC address)"}
        return {k: _scrub(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return value


def in_new_namespace(configure: Callable[[], None]) -> dict[str, Any]:
    """A fresh namespace with a TUN, `configure`d, then viewed (all on one thread)."""

    def work() -> dict[str, Any]:
        netns = enter(None)
        tun = open_tun(TUN_NAME)
        try:
            configure()
            return view()
        finally:
            discard([], tun, netns)

    return run_in_thread(work)


def test_the_tun_boundary_matches_iproute2() -> None:
    require_root()

    def ours() -> None:
        with RouteSocket() as rtnl:
            configure_tun(rtnl, ipv6=True)

    expected = in_new_namespace(lambda: ip_batch(IPROUTE2_TUN))
    assert in_new_namespace(ours) == expected
    assert any(a.get("local") == SANDBOX_V6 for link in expected["addresses"]
               for a in link.get("addr_info", []))  # fmt: skip


def test_the_veth_boundary_matches_iproute2(holder: int) -> None:
    require_root()

    def sinkhole(batch: bool) -> Callable[[], None]:
        def configure() -> None:
            if batch:
                ip_batch(
                    IPROUTE2_TUN
                    + f"link add {FAR} type veth peer name {LINK} netns /proc/{holder}/ns/net\n"
                    + f"addr add {GATEWAY_V4}/30 dev {FAR}\n"
                    + f"addr add {GATEWAY_V6}/64 dev {FAR} nodad\nlink set {FAR} up\n"
                )
            else:
                with RouteSocket() as rtnl, open(f"/proc/{holder}/ns/net") as peer:
                    configure_tun(rtnl, ipv6=True)
                    rtnl.add_veth(FAR, LINK, peer.fileno())
                    rtnl.add_address(FAR, f"{GATEWAY_V4}/30")
                    rtnl.add_address(FAR, f"{GATEWAY_V6}/64", nodad=True)
                    rtnl.link_up(FAR)
            holder_end(batch)

        return configure

    def holder_end(batch: bool) -> None:
        # The holder's side, entered from the same thread (as veth.py does).
        enter(f"/proc/{holder}/ns/net")
        for scope in ("all", "default", LINK):
            with open(f"/proc/sys/net/ipv6/conf/{scope}/disable_ipv6", "w") as f:
                f.write("0")
        if batch:
            ip_batch(
                f"link set lo up\nlink set {LINK} up\naddr add {SANDBOX_LINK_V4}/30 dev {LINK}\n"
                f"route add default via {GATEWAY_V4}\n"
                f"addr add {SANDBOX_LINK_V6}/64 dev {LINK} nodad\nroute add ::/0 via {GATEWAY_V6}\n"
            )
        else:
            with RouteSocket() as rtnl:
                rtnl.link_up("lo")
                rtnl.link_up(LINK)
                rtnl.add_address(LINK, f"{SANDBOX_LINK_V4}/30")
                rtnl.default_route_via(GATEWAY_V4)
                rtnl.add_address(LINK, f"{SANDBOX_LINK_V6}/64", nodad=True)
                rtnl.default_route_via(GATEWAY_V6)
        # Either way the kernel settles the link's operational state a moment later
        # (linkwatch); veth.py waits for it, and so does the view.
        with RouteSocket() as rtnl:
            rtnl.wait_running(LINK)

    # Each run leaves the view of the holder's namespace (the thread ends in it); the
    # link goes with the sinkhole, so the holder is as new for the second run.
    expected = in_new_namespace(sinkhole(batch=True))
    _wait_gone(holder)
    assert in_new_namespace(sinkhole(batch=False)) == expected
    assert any(r.get("gateway") == GATEWAY_V4 for r in expected["routes4"])


def _wait_gone(pid: int) -> None:
    for _ in range(200):
        out = subprocess.run(["nsenter", f"--net=/proc/{pid}/ns/net", "ip", "-o", "link"],
                             capture_output=True, text=True).stdout  # fmt: skip
        if LINK not in out:
            return
        time.sleep(0.05)
    raise AssertionError(f"{LINK} outlived its sinkhole")


@pytest.mark.parametrize(
    ("step", "message"),
    [
        # The same address twice.
        (lambda r: (r.add_address("lo", "10.9.0.1/32"), r.add_address("lo", "10.9.0.1/32")),
         "addr add 10.9.0.1/32 dev lo: File exists"),
        # A gateway no link reaches: the kernel says why.
        (lambda r: r.default_route_via("10.9.9.9"), "route add default via 10.9.9.9: "),
        # A device that is not there.
        (lambda r: r.link_up("nosuchlink0"), "nosuchlink0"),
        # A veth peer for a descriptor that names no namespace.
        (lambda r: r.add_veth("execgateX", "execgateY", 2**20), "link add execgateX"),
    ],
)  # fmt: skip
def test_a_refusal_names_its_step(step: Callable[[RouteSocket], Any], message: str) -> None:
    require_root()

    def work() -> str:
        netns = enter(None)
        try:
            with RouteSocket() as rtnl:
                rtnl.link_up("lo")
                try:
                    step(rtnl)
                except OSError as exc:
                    return str(exc)
                return "no error"
        finally:
            discard([], netns)

    assert message in run_in_thread(work)


def test_a_link_is_waited_for_until_it_runs_and_one_that_cannot_is_an_error() -> None:
    require_root()

    def work() -> tuple[bool, bool, str, str]:
        netns = enter(None)
        try:
            with RouteSocket() as rtnl:
                # Both ends here (the peer's namespace is this thread's own).
                rtnl.add_veth("execgateA", "execgateB", netns)
                rtnl.link_up("execgateA")
                # Its peer is down: no carrier, so it never runs.
                lone = bool(rtnl.link_flags("execgateA") & IFF_RUNNING)
                try:
                    rtnl.wait_running("execgateA", timeout_s=0.05)
                    stuck = "no error"
                except OSError as exc:
                    stuck = str(exc)
                rtnl.link_up("execgateB")
                rtnl.wait_running("execgateA")
                rtnl.wait_running("execgateB", rtnl.index("execgateB"))
                both = all(rtnl.link_flags(n) & IFF_RUNNING for n in ("execgateA", "execgateB"))
                try:
                    rtnl.link_flags("gone", 2**30)
                    gone = "no error"
                except OSError as exc:
                    gone = str(exc)
                return lone, both, stuck, gone
        finally:
            discard([], netns)

    lone, both, stuck, gone = run_in_thread(work)
    assert not lone and both
    assert stuck.endswith("link execgateA is not running after 0.05 s")
    assert "link show gone: No such device" in gone
