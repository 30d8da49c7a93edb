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
    TUN_SETUP_V4,
    TUN_SETUP_V6,
    BoundaryFds,
    furnish_in_thread,
)
from backends.egress.netns import discard, enter, ip_batch, open_tun

LINK = "execgate1"  # the holder's end (what the program sees)
FAR = "execgate2"  # the sinkhole's end
GATEWAY_V4, SANDBOX_LINK_V4 = "10.200.0.1", "10.200.0.2"
GATEWAY_V6, SANDBOX_LINK_V6 = "fd00:ed::1", "fd00:ed::2"
RELAY_TARGET = (GATEWAY_V4, 3128)  # where the launcher relays 127.0.0.1:3128 to


def open_veth_boundary(holder_pid: int, ip_binary: str = "ip") -> BoundaryFds:
    """Link the holder's namespace (/proc/PID/ns/net, not yet used by runsc) to
    a new sinkhole namespace served by the gateway (blocking: iproute2)."""
    return furnish_in_thread(lambda: _furnish(holder_pid, ip_binary))


def _furnish(holder_pid: int, ip_binary: str) -> BoundaryFds:
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
        ipv6 = _sysctls({"ipv6/conf/all/disable_ipv6": "0", "ipv6/conf/default/disable_ipv6": "0"})
        _sysctls({"ipv4/ip_forward": "1", "ipv4/conf/all/rp_filter": "0"})
        if ipv6:
            _sysctls({"ipv6/conf/all/forwarding": "1"})
        tun = open_tun(TUN_NAME)
        batch = TUN_SETUP_V4 + (TUN_SETUP_V6 if ipv6 else "")
        batch += f"link add {FAR} type veth peer name {LINK} netns {holder_pid}\n"
        batch += f"addr add {GATEWAY_V4}/30 dev {FAR}\n"
        if ipv6:
            batch += f"addr add {GATEWAY_V6}/64 dev {FAR} nodad\n"
        batch += f"link set {FAR} up\n"
        ip_batch(ip_binary, batch)
        proxy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        made.append(proxy)
        proxy.bind(RELAY_TARGET)
        proxy.listen(128)
        resolver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        made.append(resolver)
        resolver.bind((GATEWAY_V4, 53))
        for sock in made:
            sock.setblocking(False)
        # Now the holder's side, from the same thread (sockets stay where they were made).
        enter(holder)
        if ipv6:
            _sysctls({f"ipv6/conf/{k}/disable_ipv6": "0" for k in ("all", "default", LINK)})
        batch = f"link set lo up\nlink set {LINK} up\naddr add {SANDBOX_LINK_V4}/30 dev {LINK}\n"
        batch += f"route add default via {GATEWAY_V4}\n"
        if ipv6:
            batch += f"addr add {SANDBOX_LINK_V6}/64 dev {LINK} nodad\n"
            batch += f"route add ::/0 via {GATEWAY_V6}\n"
        ip_batch(ip_binary, batch)
        return BoundaryFds(tun=tun, proxy=proxy, resolver=resolver, netns=netns)
    except BaseException:
        discard(made, tun, netns)
        raise


def _sysctls(values: dict[str, str]) -> bool:
    """Write /proc/sys/net keys (the calling thread's namespace); False if one is missing."""
    for key, value in values.items():
        try:
            with open(f"/proc/sys/net/{key}", "w") as f:
                f.write(value)
        except FileNotFoundError:
            return False
    return True
