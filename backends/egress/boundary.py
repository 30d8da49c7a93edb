"""A sandbox's network namespace, furnished by the gateway.

setns(CLONE_NEWNET) and unshare(CLONE_NEWNET) change only the calling thread,
and a socket or TUN device belongs to the namespace it was created in, for
good. So a dedicated short-lived thread enters (or makes) the sandbox's
namespace, creates the proxy listener, the resolver socket and the TUN device
there, configures them with iproute2 (a child forked from that thread starts
in its namespace), and ends: the gateway's own threads never change namespace,
and it serves the sockets from its event loop with no relay in between.

Nothing is named on the host: the namespace lives while a process in it or a
descriptor of it (the TUN, the sockets, `netns`) does, so a crashed gateway
leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from backends.egress.netns import (
    discard,
    enable_ipv6,
    enter,
    ip_batch,
    ipv6_disabled,
    open_tun,
    run_in_thread,
)

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

TUN_SETUP_V4 = f"""link set lo up
link set dev {TUN_NAME} addrgenmode none
link set dev {TUN_NAME} up
addr add {SANDBOX_V4}/32 dev {TUN_NAME}
route add default dev {TUN_NAME}
"""
TUN_SETUP_V6 = f"""addr add {SANDBOX_V6}/128 dev {TUN_NAME} nodad
route add ::/0 dev {TUN_NAME}
"""


class BoundaryError(Exception):
    """The sandbox's network boundary could not be made."""


@dataclass(slots=True)
class BoundaryFds:
    """What the gateway holds of one sandbox's namespace (closing it frees all)."""

    tun: int
    proxy: socket.socket
    resolver: socket.socket
    netns: int | None = None  # kept only for a namespace made here (nsjail joins it)

    def close(self) -> None:
        self.proxy.close()
        self.resolver.close()
        for fd in (self.tun, self.netns):
            if fd is not None and fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.tun, self.netns = -1, None


def open_boundary(netns_path: str | None = None, ip_binary: str = "ip") -> BoundaryFds:
    """Furnish `netns_path` (e.g. a container's /proc/PID/ns/net), or a new
    namespace if None (blocking: a few milliseconds of iproute2)."""
    return furnish_in_thread(lambda: _furnish(netns_path, ip_binary))


def furnish_in_thread(furnish: Callable[[], BoundaryFds]) -> BoundaryFds:
    """Run `furnish` on a thread of its own (netns.run_in_thread); what fails in the
    namespace's set-up is a BoundaryError."""
    try:
        return run_in_thread(furnish)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BoundaryError(f"cannot make the network boundary: {exc}") from exc


def _furnish(netns_path: str | None, ip_binary: str) -> BoundaryFds:
    netns = enter(netns_path)  # this thread only, and it ends after this
    made: list[socket.socket] = []
    tun = -1
    try:
        enable_ipv6()
        tun = open_tun(TUN_NAME)
        # One iproute2 run (a few ms each, the bulk of this set-up's cost).
        ip_batch(ip_binary, TUN_SETUP_V4 if ipv6_disabled() else TUN_SETUP_V4 + TUN_SETUP_V6)
        proxy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        made.append(proxy)
        proxy.bind((PROXY_HOST, PROXY_PORT))
        proxy.listen(128)
        resolver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        made.append(resolver)
        resolver.bind((RESOLVER_HOST, 53))
        for sock in made:
            sock.setblocking(False)
        return BoundaryFds(tun=tun, proxy=proxy, resolver=resolver, netns=netns)
    except BaseException:
        discard(made, tun, netns)
        raise
