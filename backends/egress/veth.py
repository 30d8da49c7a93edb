"""A boundary for gVisor: a namespace of its own, linked into a sinkhole the gateway owns.

runsc's own netstack (the `runsc-egress` runtime) takes over the links and routes
of the container's network namespace when the sandbox starts, and never uses the
host kernel's sockets there: a TUN, a proxy or a resolver in that namespace would
be invisible to the program. So the gateway makes that namespace itself (new, with
loopback and one end of a veth pair) and the runtime puts the gVisor sandbox in it
(deploy/docker/runsc-netns, named by /proc/GATEWAY/fd/N). The other end lives in a
second new namespace furnished like the TUN boundary (backends/egress/boundary.py):
the proxy and the resolver listen on the far end's address, and the kernel there
forwards everything else into the TUN, where the recorder logs it and answers a
TCP reset or NXDOMAIN. Nothing is forwarded anywhere else: the sinkhole has no
other link. Both namespaces live as long as the gateway's descriptors (and the
sandbox's processes): nothing is left behind when either goes.
"""

from __future__ import annotations

import socket

from backends.egress.boundary import (
    TUN_NAME,
    BoundaryFds,
    configure_tun,
    furnish_in_thread,
    listeners,
)
from backends.egress.netns import IPV6_ON, discard, enter, join, open_tun, set_sysctls
from backends.egress.rtnl import RouteSocket

LINK = "execgate1"  # the sandbox's end (what the program sees)
FAR = "execgate2"  # the sinkhole's end
GATEWAY_V4, SANDBOX_LINK_V4 = "10.200.0.1", "10.200.0.2"
GATEWAY_V6, SANDBOX_LINK_V6 = "fd00:ed::1", "fd00:ed::2"
RELAY_TARGET = (GATEWAY_V4, 3128)  # where the launcher relays 127.0.0.1:3128 to


def open_veth_boundary() -> BoundaryFds:
    """A new namespace for a sandbox (BoundaryFds.sandbox), linked to a new sinkhole
    namespace served by the gateway (blocking: netlink requests on a thread of its
    own)."""
    return furnish_in_thread(_furnish)


def _furnish() -> BoundaryFds:
    made: list[socket.socket] = []
    tun, sandbox, netns = -1, None, None
    try:
        # The sandbox's first: the link's end is made straight in it, and this
        # thread comes back to it from the sinkhole.
        sandbox = enter(None)
        netns = enter(None)  # the sinkhole: this thread only
        assert sandbox is not None and netns is not None
        ipv6 = set_sysctls(IPV6_ON)
        set_sysctls({"ipv4/ip_forward": "1", "ipv4/conf/all/rp_filter": "0"})
        if ipv6:
            set_sysctls({"ipv6/conf/all/forwarding": "1"})
        tun = open_tun(TUN_NAME)
        with RouteSocket() as sinkhole:  # stays the sinkhole's after the thread leaves
            configure_tun(sinkhole, ipv6)
            sinkhole.add_veth(FAR, LINK, sandbox)
            sinkhole.add_address(FAR, f"{GATEWAY_V4}/30")
            if ipv6:
                sinkhole.add_address(FAR, f"{GATEWAY_V6}/64", nodad=True)
            sinkhole.link_up(FAR)
            far = sinkhole.index(FAR)
            proxy, resolver = listeners(made, RELAY_TARGET, (GATEWAY_V4, 53))
            # Now the sandbox's side, from the same thread (sockets stay where they were made).
            join(sandbox, "the sandbox's network namespace")
            if ipv6:
                set_sysctls({**IPV6_ON, f"ipv6/conf/{LINK}/disable_ipv6": "0"})
            with RouteSocket() as rtnl:  # made after entering: the sandbox's
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
        return BoundaryFds(tun=tun, proxy=proxy, resolver=resolver, netns=netns, sandbox=sandbox)
    except BaseException:
        discard(made, tun, netns, sandbox)
        raise
