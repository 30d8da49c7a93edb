"""Links, addresses and routes of a sandbox's namespace, over rtnetlink.

The boundaries (boundary.py, veth.py) used to run `ip -batch` for this: a fork
and exec of iproute2 per sandbox (~1.4 ms of CPU each, most of it the dynamic
linker), found through the gateway's PATH and run as root. These are the same
requests iproute2 sends, made from the thread that is in the namespace: a
netlink socket belongs to the namespace of the thread that creates it, so a
`RouteSocket` is made after the thread has entered (or made) the namespace it
configures, and used only there.

Each request asks for an acknowledgement and is read back before the next is
sent, so a refusal names the step it stopped at (with the kernel's own message
where it gives one).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
import struct
import time
from types import TracebackType

NETLINK_ROUTE = 0
SOL_NETLINK = 270
NETLINK_CAP_ACK, NETLINK_EXT_ACK = 10, 11

NLMSG_ERROR = 2
NLM_F_REQUEST, NLM_F_ACK = 0x1, 0x4
NLM_F_EXCL, NLM_F_CREATE = 0x200, 0x400
NLM_F_ACK_TLVS = 0x200  # in an acknowledgement: extended-ack attributes follow
NLMSGERR_ATTR_MSG = 1

RTM_NEWLINK, RTM_GETLINK, RTM_NEWADDR, RTM_NEWROUTE = 16, 18, 20, 24
IFF_UP, IFF_RUNNING = 0x1, 0x40
IFLA_IFNAME, IFLA_LINKINFO, IFLA_AF_SPEC, IFLA_NET_NS_FD = 3, 18, 26, 28
IFLA_INFO_KIND, IFLA_INFO_DATA = 1, 2
VETH_INFO_PEER = 1
IFLA_INET6_ADDR_GEN_MODE, IN6_ADDR_GEN_MODE_NONE = 8, 1
IFA_ADDRESS, IFA_LOCAL = 1, 2
IFA_F_NODAD = 0x02
RTA_OIF, RTA_GATEWAY = 4, 5
RT_TABLE_MAIN, RTPROT_BOOT, RTN_UNICAST = 254, 3, 1
RT_SCOPE_UNIVERSE, RT_SCOPE_LINK = 0, 253

NLMSGHDR = struct.Struct("=IHHII")
NLMSGERR = struct.Struct("=i")
IFINFOMSG = struct.Struct("=BxHiII")
IFADDRMSG = struct.Struct("=BBBBI")
RTMSG = struct.Struct("=BBBBBBBBI")
NLA = struct.Struct("=HH")


def _align(n: int) -> int:
    return (n + 3) & ~3


def attr(kind: int, payload: bytes) -> bytes:
    """One netlink attribute, padded to its 4-byte boundary."""
    size = NLA.size + len(payload)
    return NLA.pack(size, kind) + payload + b"\0" * (_align(size) - size)


def _name(name: str) -> bytes:
    return name.encode() + b"\0"


def _family(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> int:
    return socket.AF_INET if address.version == 4 else socket.AF_INET6


class RouteSocket:
    """An rtnetlink socket in the calling thread's network namespace."""

    def __init__(self) -> None:
        self.sock = socket.socket(
            socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_ROUTE
        )
        try:
            self.sock.bind((0, 0))
            # The kernel's reason with a refusal, and not the request echoed back.
            for option in (NETLINK_EXT_ACK, NETLINK_CAP_ACK):
                self.sock.setsockopt(SOL_NETLINK, option, 1)
        except BaseException:
            self.sock.close()
            raise
        self.seq = 0

    def __enter__(self) -> RouteSocket:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.sock.close()

    # --- the requests -----------------------------------------------------------

    def link_up(self, name: str) -> None:
        body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, self.index(name), IFF_UP, IFF_UP)
        self.request(RTM_NEWLINK, 0, body, f"link set {name} up")

    def no_ipv6_link_local(self, name: str) -> None:
        """No address of the kernel's own on the link (`addrgenmode none`): the
        sandbox's addresses are the ones set here."""
        mode = attr(IFLA_INET6_ADDR_GEN_MODE, bytes([IN6_ADDR_GEN_MODE_NONE]))
        spec = attr(IFLA_AF_SPEC, attr(socket.AF_INET6, mode))
        body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, self.index(name), 0, 0) + spec
        self.request(RTM_NEWLINK, 0, body, f"link set dev {name} addrgenmode none")

    def add_address(self, name: str, cidr: str, *, nodad: bool = False) -> None:
        """`addr add CIDR dev NAME [nodad]`."""
        iface = ipaddress.ip_interface(cidr)
        packed = iface.ip.packed
        body = IFADDRMSG.pack(
            _family(iface.ip), iface.network.prefixlen, IFA_F_NODAD if nodad else 0,
            RT_SCOPE_UNIVERSE, self.index(name),
        )  # fmt: skip
        body += attr(IFA_LOCAL, packed) + attr(IFA_ADDRESS, packed)
        self.request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, body, f"addr add {cidr} dev {name}")

    def default_route_dev(self, dev: str, family: int = socket.AF_INET) -> None:
        """`route add default dev DEV` (`route add ::/0 dev DEV` for AF_INET6)."""
        # Scoped as iproute2 does: link for IPv4 with no gateway, universe for IPv6.
        scope = RT_SCOPE_LINK if family == socket.AF_INET else RT_SCOPE_UNIVERSE
        attrs = attr(RTA_OIF, struct.pack("=i", self.index(dev)))
        self._route(family, scope, attrs, f"route add default dev {dev}")

    def default_route_via(self, gateway: str) -> None:
        """`route add default via GATEWAY` (IPv4 or IPv6, as the address is)."""
        address = ipaddress.ip_address(gateway)
        attrs = attr(RTA_GATEWAY, address.packed)
        self._route(_family(address), RT_SCOPE_UNIVERSE, attrs, f"route add default via {gateway}")

    def add_veth(self, name: str, peer: str, peer_netns_fd: int) -> None:
        """`link add NAME type veth peer name PEER netns PATH`: the peer end is made
        straight in the namespace behind descriptor `peer_netns_fd`."""
        peer_info = IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
        peer_info += attr(IFLA_IFNAME, _name(peer))
        peer_info += attr(IFLA_NET_NS_FD, struct.pack("=I", peer_netns_fd))
        data = attr(VETH_INFO_PEER, peer_info)
        info = attr(IFLA_INFO_KIND, b"veth\0") + attr(IFLA_INFO_DATA, data)
        body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
        body += attr(IFLA_IFNAME, _name(name)) + attr(IFLA_LINKINFO, info)
        what = f"link add {name} type veth peer name {peer} netns fd {peer_netns_fd}"
        self.request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, body, what)

    def link_flags(self, name: str, index: int | None = None) -> int:
        """The link's flags as `ip link show` prints them (IFF_*). `index` names it
        where this thread is no longer in the socket's namespace."""
        index = self.index(name) if index is None else index
        body = IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, 0, 0)
        reply = self.query(RTM_GETLINK, RTM_NEWLINK, body, f"link show {name}")
        return int(IFINFOMSG.unpack_from(reply, NLMSGHDR.size)[3])

    def wait_running(self, name: str, index: int | None = None, *, timeout_s: float = 2.0) -> None:
        """Until the link is operationally up. A veth end's carrier comes on with its
        peer's, but the kernel settles the rest later, from its linkwatch work queue:
        until then the link has no queueing discipline and what it sends is dropped
        (a sandbox's first packet, a sinkhole's reset). Linkwatch runs a veth's event
        at once, so this is a few polls; a link that never comes up is an error."""
        deadline = time.monotonic() + timeout_s
        while not self.link_flags(name, index) & IFF_RUNNING:
            if time.monotonic() > deadline:
                raise OSError(errno.ETIMEDOUT, f"link {name} is not running after {timeout_s} s")
            time.sleep(0.0002)

    # --- plumbing ---------------------------------------------------------------

    @staticmethod
    def index(name: str) -> int:
        # A socket of glibc's own, made here: it looks the name up in this thread's namespace.
        try:
            return socket.if_nametoindex(name)
        except OSError:
            raise OSError(errno.ENODEV, f"no link {name} in this network namespace") from None

    def _route(self, family: int, scope: int, attrs: bytes, what: str) -> None:
        body = RTMSG.pack(family, 0, 0, 0, RT_TABLE_MAIN, RTPROT_BOOT, scope, RTN_UNICAST, 0)
        self.request(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, body + attrs, what)

    def request(self, kind: int, flags: int, body: bytes, what: str) -> None:
        """Send one request and wait for its acknowledgement; OSError names `what`."""
        self._exchange(kind, NLM_F_ACK | flags, body, what, None)

    def query(self, kind: int, answer: int, body: bytes, what: str) -> bytes:
        """Send one request and return the kernel's answer (a message of type `answer`)."""
        reply = self._exchange(kind, 0, body, what, answer)
        assert reply is not None
        return reply

    def _exchange(
        self, kind: int, flags: int, body: bytes, what: str, answer: int | None
    ) -> bytes | None:
        self.seq += 1
        seq = self.seq
        header = NLMSGHDR.pack(NLMSGHDR.size + len(body), kind, NLM_F_REQUEST | flags, seq, 0)
        self.sock.send(header + body)
        while True:
            data = self.sock.recv(65536)
            offset = 0
            while offset + NLMSGHDR.size <= len(data):
                size, got, got_flags, got_seq, _ = NLMSGHDR.unpack_from(data, offset)
                if size < NLMSGHDR.size:
                    raise OSError(f"{what}: malformed netlink reply")
                message = data[offset : offset + size]
                offset += _align(size)
                if got_seq != seq:
                    continue
                if got == NLMSG_ERROR:
                    error = _reply_error(message, got_flags, what)
                    if error is not None:
                        raise error
                    if answer is None:
                        return None
                elif got == answer:
                    return message


def _reply_error(message: bytes, flags: int, what: str) -> OSError | None:
    (error,) = NLMSGERR.unpack_from(message, NLMSGHDR.size)
    if error == 0:
        return None
    reason = os.strerror(-error)
    if flags & NLM_F_ACK_TLVS:
        detail = _ext_ack_message(message[NLMSGHDR.size * 2 + NLMSGERR.size :])
        if detail:
            reason = f"{reason} ({detail})"
    return OSError(-error, f"{what}: {reason}")


def _ext_ack_message(tlvs: bytes) -> str:
    offset = 0
    while offset + NLA.size <= len(tlvs):
        size, kind = NLA.unpack_from(tlvs, offset)
        if size < NLA.size:
            break
        if kind & 0x3FFF == NLMSGERR_ATTR_MSG:
            text = tlvs[offset + NLA.size : offset + size].split(b"\0", 1)[0]
            return text.decode(errors="replace")
        offset += _align(size)
    return ""
