"""A sandbox's network namespace, furnished by the gateway.

setns(CLONE_NEWNET) and unshare(CLONE_NEWNET) change only the calling thread,
and a socket or TUN device belongs to the namespace it was created in, for
good. So a dedicated short-lived thread enters (or makes) the sandbox's
namespace, creates the proxy listener, the resolver socket and the TUN device
there, configures them over rtnetlink from that thread (backends/egress/rtnl.py),
and ends: the gateway's own threads never change namespace,
and it serves the sockets from its event loop with no relay in between.

Nothing is named on the host: the namespace lives while a process in it or a
descriptor of it (the TUN, the sockets, `netns`) does, so a crashed gateway
leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass

from backends.egress.netns import (
    discard,
    enable_ipv6,
    enter,
    open_tun,
    run_in_thread,
)
from backends.egress.rtnl import RouteSocket

TUN_NAME = "execgate0"
PROXY_HOST, PROXY_PORT = "127.0.0.1", 3128
PROXY_URL = f"http://{PROXY_HOST}:{PROXY_PORT}"
RESOLVER_HOST = "127.0.0.53"
# The sandbox's own addresses on the TUN: sources of its direct attempts.
SANDBOX_V4, SANDBOX_V6 = "100.64.0.2", "fd00:ec::2"
RESOLV_CONF = f"nameserver {RESOLVER_HOST}\noptions timeout:1 attempts:1\n"
# What the code's environment says about the way out (and nothing else does).
PROXY_ENV = tuple(
    f"{name}={PROXY_URL}"
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy")
)


def configure_tun(rtnl: RouteSocket, ipv6: bool) -> None:
    """Loopback up, and the TUN as the sandbox's only way anywhere else: its
    addresses, and the default routes into it (IPv6 too unless it is off)."""
    rtnl.link_up("lo")
    rtnl.no_ipv6_link_local(TUN_NAME)
    rtnl.link_up(TUN_NAME)
    rtnl.add_address(TUN_NAME, f"{SANDBOX_V4}/32")
    rtnl.default_route_dev(TUN_NAME)
    if ipv6:
        rtnl.add_address(TUN_NAME, f"{SANDBOX_V6}/128", nodad=True)
        rtnl.default_route_dev(TUN_NAME, socket.AF_INET6)


class BoundaryError(Exception):
    """The sandbox's network boundary could not be made."""


@dataclass(slots=True)
class BoundaryFds:
    """What the gateway holds of one sandbox's namespace (closing it frees all)."""

    tun: int
    proxy: socket.socket
    resolver: socket.socket
    netns: int | None = None  # kept only for a namespace made here (nsjail joins it)
    # veth.py's: the namespace a gVisor sandbox is put in (linked to the sinkhole,
    # which is `netns` then); the runtime opens it as /proc/GATEWAY/fd/N.
    sandbox: int | None = None

    def close(self) -> None:
        self.proxy.close()
        self.resolver.close()
        for fd in (self.tun, self.netns, self.sandbox):
            if fd is not None and fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.tun, self.netns, self.sandbox = -1, None, None


def open_boundary(netns_path: str | None = None) -> BoundaryFds:
    """Furnish `netns_path` (e.g. a container's /proc/PID/ns/net), or a new
    namespace if None (blocking: a thread's start and a dozen netlink requests)."""
    return furnish_in_thread(lambda: _furnish(netns_path))


def furnish_in_thread(furnish: Callable[[], BoundaryFds]) -> BoundaryFds:
    """Run `furnish` on a thread of its own (netns.run_in_thread); what fails in the
    namespace's set-up is a BoundaryError."""
    try:
        return run_in_thread(furnish)
    except OSError as exc:
        raise BoundaryError(f"cannot make the network boundary: {exc}") from exc


def _furnish(netns_path: str | None) -> BoundaryFds:
    netns = enter(netns_path)  # this thread only, and it ends after this
    made: list[socket.socket] = []
    tun = -1
    try:
        ipv6 = enable_ipv6()
        tun = open_tun(TUN_NAME)
        with RouteSocket() as rtnl:  # made here: this namespace's
            configure_tun(rtnl, ipv6=ipv6)
        proxy, resolver = listeners(made, (PROXY_HOST, PROXY_PORT), (RESOLVER_HOST, 53))
        return BoundaryFds(tun=tun, proxy=proxy, resolver=resolver, netns=netns)
    except BaseException:
        discard(made, tun, netns)
        raise


def listeners(
    made: list[socket.socket], proxy_at: tuple[str, int], resolver_at: tuple[str, int]
) -> tuple[socket.socket, socket.socket]:
    """The proxy's listening socket and the resolver's, bound in the calling thread's
    namespace (non-blocking, for the gateway's loop); each is in `made` as soon as it
    exists, so a failure part-way closes what was made."""
    proxy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    made.append(proxy)
    proxy.bind(proxy_at)
    proxy.listen(128)
    resolver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    made.append(resolver)
    resolver.bind(resolver_at)
    for sock in made:
        sock.setblocking(False)
    return proxy, resolver
