"""Namespace plumbing for the egress boundaries (boundary.py, veth.py).

setns/unshare(CLONE_NEWNET) change only the calling thread, so everything here runs
on a short-lived thread of its own (`run_in_thread`) that enters or makes the
namespace, creates its sockets and devices there, and ends.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
import threading
from collections.abc import Callable
from typing import TypeVar

CLONE_NEWNET = 0x40000000
TUNSETIFF = 0x400454CA
IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
# "all" first: written, it sets every link's own value too (so `lo` then reads 0);
# read as 0 already, `lo` may still be off on its own (docker's `none` network).
IPV6_ON = {f"ipv6/conf/{scope}/disable_ipv6": "0" for scope in ("all", "default", "lo")}

T = TypeVar("T")
# unshare(2) and setns(2) (os has them from Python 3.12 on).
_LIBC = ctypes.CDLL(None, use_errno=True)


def run_in_thread(work: Callable[[], T]) -> T:
    """Run `work` on a thread of its own, which may change namespace and ends."""
    result: list[T | BaseException] = []

    def target() -> None:
        try:
            result.append(work())
        except BaseException as exc:  # handed to the caller's thread
            result.append(exc)

    thread = threading.Thread(target=target, name="execgate-netns", daemon=True)
    thread.start()
    thread.join()
    outcome = result[0]
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


def enter(netns_path: str | None) -> int | None:
    """Move the calling thread into `netns_path`, or a new namespace if None (then
    a descriptor of it is returned)."""
    if netns_path is None:
        if _LIBC.unshare(CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
        return os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        join(fd, netns_path)
    finally:
        os.close(fd)
    return None


def join(fd: int, name: str = "") -> None:
    """Move the calling thread into the namespace behind descriptor `fd`."""
    # Never the gateway's own (a container on the host network): routing it
    # into a TUN would cut the host off, and it is no sandbox's to record.
    target, own = os.fstat(fd), os.stat("/proc/self/ns/net")
    name = name or f"network namespace descriptor {fd}"
    if (target.st_dev, target.st_ino) == (own.st_dev, own.st_ino):
        raise OSError(f"{name} is the gateway's own network namespace")
    if _LIBC.setns(fd, CLONE_NEWNET) != 0:
        raise OSError(ctypes.get_errno(), f"setns({name})")


def discard(made: list[socket.socket], *fds: int | None) -> None:
    """Close what a half-made boundary holds (a failed set-up leaves nothing open)."""
    for sock in made:
        sock.close()
    for fd in fds:
        if fd is not None and fd >= 0:
            os.close(fd)


def open_tun(name: str) -> int:
    tun = os.open("/dev/net/tun", os.O_RDWR | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        fcntl.ioctl(tun, TUNSETIFF, struct.pack("16sH", name.encode(), IFF_TUN | IFF_NO_PI))
    except BaseException:
        os.close(tun)
        raise
    return tun


def set_sysctls(values: dict[str, str]) -> bool:
    """Set /proc/sys/net keys in the calling thread's namespace; False if one is
    missing. Each is read first and written only if it differs: a write of
    disable_ipv6 or ip_forward takes the host-wide rtnl lock with a trylock and
    restarts itself until it gets it, so it spins while the kernel tears down
    other namespaces (which holds that lock), and a fresh namespace mostly has
    the value already (measured here: 0.35-0.73 ms less of the gateway's CPU per
    nsjail execution at concurrency 4, of ~15)."""
    for key, value in values.items():
        path = f"/proc/sys/net/{key}"
        try:
            with open(path) as f:
                if f.read().strip() == value:
                    continue
            with open(path, "w") as f:
                f.write(value)
        except FileNotFoundError:
            return False
    return True


def enable_ipv6() -> bool:
    """Docker's `none` network turns IPv6 off; on, its direct attempts reach the
    recorder too (with it off they fail unrecorded). /proc/sys/net is the
    writing thread's namespace: this one's. True if IPv6 is on here now."""
    try:
        if not set_sysctls(IPV6_ON):
            return False  # no IPv6 here: nothing to record either
    except OSError:
        return not ipv6_disabled()  # not ours to change: as it is
    return True


def ipv6_disabled() -> bool:
    # /proc/sys/net shows the namespace of the reading thread: this one's.
    try:
        with open("/proc/sys/net/ipv6/conf/all/disable_ipv6") as f:
            return f.read().strip() == "1"
    except OSError:
        return True  # no IPv6 in this kernel
