"""A boundary for gVisor: a link into a sinkhole namespace the gateway owns.

runsc's own netstack (the `runsc-egress` runtime) takes over the links and routes
of the container's network namespace when the sandbox starts, and never uses the
host kernel's sockets there: a TUN, a proxy or a resolver in that namespace would
be invisible to the program. So the namespace (a holder container's, which the
gVisor container joins) gets one end of a veth pair, and the other end lives in
a new namespace furnished like the TUN boundary (backends/egress/boundary.py):
the proxy and the resolver listen on the far end's address, and the kernel there
forwards everything else into the TUN, where the recorder logs it and answers a
TCP reset or NXDOMAIN. Nothing is forwarded anywhere else: the sinkhole has no
other link.
"""

from __future__ import annotations

import os
import socket

from backends.egress.boundary import (
    TUN_NAME,
    BoundaryFds,
    configure_tun,
    furnish_in_thread,
    listeners,
)
from backends.egress.netns import IPV6_ON, discard, enter, open_tun, set_sysctls
from backends.egress.rtnl import RouteSocket

LINK = "execgate1"  # the holder's end (what the program sees)
FAR = "execgate2"  # the sinkhole's end
GATEWAY_V4, SANDBOX_LINK_V4 = "10.200.0.1", "10.200.0.2"
GATEWAY_V6, SANDBOX_LINK_V6 = "fd00:ed::1", "fd00:ed::2"
RELAY_TARGET = (GATEWAY_V4, 3128)  # where the launcher relays 127.0.0.1:3128 to


def open_veth_boundary(holder_pid: int) -> BoundaryFds:
    """Link the holder's namespace (/proc/PID/ns/net, not yet used by runsc) to
    a new sinkhole namespace served by the gateway (blocking: netlink requests
    on a thread of its own)."""
    return furnish_in_thread(lambda: _furnish(holder_pid))


def _furnish(holder_pid: int) -> BoundaryFds:
    holder = f"/proc/{holder_pid}/ns/net"
    # Before anything is made: the link's end must never land in the gateway's own
    # namespace (enter() checks again when this thread joins the holder's).
    target, own = os.stat(holder), os.stat("/proc/self/ns/net")
    if (target.st_dev, target.st_ino) == (own.st_dev, own.st_ino):
        raise OSError(f"{holder} is the gateway's own network namespace")
    netns = enter(None)  # the sinkhole: this thread only
    made: list[socket.socket] = []
    tun = -1
    try:
        ipv6 = set_sysctls(IPV6_ON)
        set_sysctls({"ipv4/ip_forward": "1", "ipv4/conf/all/rp_filter": "0"})
        if ipv6:
            set_sysctls({"ipv6/conf/all/forwarding": "1"})
        tun = open_tun(TUN_NAME)
        with RouteSocket() as sinkhole:  # stays the sinkhole's after the thread leaves
            configure_tun(sinkhole, ipv6)
            sinkhole.add_veth(FAR, LINK, holder_pid)
            sinkhole.add_address(FAR, f"{GATEWAY_V4}/30")
            if ipv6:
                sinkhole.add_address(FAR, f"{GATEWAY_V6}/64", nodad=True)
            sinkhole.link_up(FAR)
            far = sinkhole.index(FAR)
            proxy, resolver = listeners(made, RELAY_TARGET, (GATEWAY_V4, 53))
            # Now the holder's side, from the same thread (sockets stay where they were made).
            enter(holder)
            if ipv6:
                set_sysctls({**IPV6_ON, f"ipv6/conf/{LINK}/disable_ipv6": "0"})
            with RouteSocket() as rtnl:  # made after entering: the holder's
                rtnl.link_up("lo")
                rtnl.link_up(LINK)
                rtnl.add_address(LINK, f"{SANDBOX_LINK_V4}/30")
                rtnl.default_route_via(GATEWAY_V4)
                if ipv6:
                    rtnl.add_address(LINK, f"{SANDBOX_LINK_V6}/64", nodad=True)
                    rtnl.default_route_via(GATEWAY_V6)
                # Both ends carry traffic before the boundary is handed over.
                rtnl.wait_running(LINK)
            sinkhole.wait_running(FAR, far)
        return BoundaryFds(tun=tun, proxy=proxy, resolver=resolver, netns=netns)
    except BaseException:
        discard(made, tun, netns)
        raise
