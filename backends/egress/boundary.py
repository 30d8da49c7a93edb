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
import ctypes
import fcntl
import os
import socket
import struct
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass

CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000

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

_V4_SETUP = f"""link set lo up
link set dev {TUN_NAME} addrgenmode none
link set dev {TUN_NAME} up
addr add {SANDBOX_V4}/32 dev {TUN_NAME}
route add default dev {TUN_NAME}
"""
_V6_SETUP = f"""addr add {SANDBOX_V6}/128 dev {TUN_NAME} nodad
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
    return _run_in_thread(lambda: _furnish(netns_path, ip_binary))


def _run_in_thread(furnish: Callable[[], BoundaryFds]) -> BoundaryFds:
    """Run `furnish` on a thread of its own, which may change namespace and ends."""
    result: list[BoundaryFds | BaseException] = []

    def work() -> None:
        try:
            result.append(furnish())
        except BaseException as exc:  # handed to the caller's thread
            result.append(exc)

    thread = threading.Thread(target=work, name="execgate-netns", daemon=True)
    thread.start()
    thread.join()
    outcome = result[0]
    if isinstance(outcome, BaseException):
        if isinstance(outcome, OSError | subprocess.SubprocessError):
            raise BoundaryError(f"cannot make the network boundary: {outcome}") from outcome
        raise outcome
    return outcome


def _enter(netns_path: str | None) -> int | None:
    libc = ctypes.CDLL(None, use_errno=True)
    if netns_path is None:
        if libc.unshare(CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
        return os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        # Never the gateway's own (a container on the host network): routing it
        # into a TUN would cut the host off, and it is no sandbox's to record.
        target, own = os.fstat(fd), os.stat("/proc/self/ns/net")
        if (target.st_dev, target.st_ino) == (own.st_dev, own.st_ino):
            raise OSError(f"{netns_path} is the gateway's own network namespace")
        if libc.setns(fd, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns({netns_path})")
    finally:
        os.close(fd)
    return None


def _furnish(netns_path: str | None, ip_binary: str) -> BoundaryFds:
    netns = _enter(netns_path)  # this thread only, and it ends after this
    made: list[socket.socket] = []
    tun = -1
    try:
        _enable_ipv6()
        tun = _open_tun()
        # One iproute2 run (a few ms each, the bulk of this set-up's cost).
        _ip(ip_binary, _V4_SETUP if _ipv6_disabled() else _V4_SETUP + _V6_SETUP)
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
        _discard(made, tun, netns)
        raise


def _discard(made: list[socket.socket], *fds: int | None) -> None:
    """Close what a half-made boundary holds (a failed set-up leaves nothing open)."""
    for sock in made:
        sock.close()
    for fd in fds:
        if fd is not None and fd >= 0:
            os.close(fd)


def _open_tun() -> int:
    tun = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        fcntl.ioctl(tun, TUNSETIFF, struct.pack("16sH", TUN_NAME.encode(), IFF_TUN | IFF_NO_PI))
    except BaseException:
        os.close(tun)
        raise
    return tun


def _ip(ip_binary: str, batch: str) -> None:
    done = subprocess.run(
        [ip_binary, "-batch", "-"], input=batch.encode(), capture_output=True, timeout=10
    )
    if done.returncode != 0:
        raise OSError(f"ip -batch failed: {done.stderr.decode(errors='replace').strip()[:300]}")


def _enable_ipv6() -> None:
    """Docker's `none` network turns IPv6 off; on, its direct attempts reach the
    recorder too (with it off they fail unrecorded). /proc/sys/net is the
    writing thread's namespace: this one's."""
    for scope in ("all", "default"):
        try:
            with open(f"/proc/sys/net/ipv6/conf/{scope}/disable_ipv6", "w") as f:
                f.write("0")
        except OSError:
            return  # no IPv6 here: nothing to record either


def _ipv6_disabled() -> bool:
    # /proc/sys/net shows the namespace of the reading thread: this one's.
    try:
        with open("/proc/sys/net/ipv6/conf/all/disable_ipv6") as f:
            return f.read().strip() == "1"
    except OSError:
        return True  # no IPv6 in this kernel
