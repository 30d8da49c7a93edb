"""Neighbours and network: the gateway's processes, IPC, sockets and loopback.

The only addresses any probe sends to are the host's 127.0.0.1 and ::1, where
the host side (host.py) listens and counts what arrives."""

# Probe programs are data: their lines stay as the sandbox will run them.
# ruff: noqa: E501

from __future__ import annotations

from backends.egress.boundary import TUN_NAME
from backends.egress.veth import LINK as VETH_LINK
from gateway.escape.technique import Technique, python

CONNECT = r"""
def reach(family, kind, addr):
    try:
        s = socket.socket(family, kind)
        s.settimeout(1.0)
        if kind == socket.SOCK_STREAM:
            s.connect(addr)
            s.sendall(H['token'].encode())
        else:
            s.sendto(H['token'].encode(), addr)
        s.close()
        return kind == socket.SOCK_STREAM, 'connected' if kind == socket.SOCK_STREAM else 'sent'
    except OSError as exc:
        return False, str(exc)
"""


def _loopback(family: str, kind: str, host: str, port_key: str) -> str:
    return (
        CONNECT + f"ok, how = reach(socket.{family}, socket.{kind}, ('{host}', H['{port_key}']))\n"
        "report(ok, how + ' (the host counts what arrives)')\n"
    )


def _socket(family: int, kind: int, proto: int) -> str:
    return (
        "try:\n"
        f"    s = socket.socket({family}, {kind}, {proto})\n"
        "    report(True, 'socket created')\n"
        "except OSError as exc:\n"
        "    report(False, f'refused: {exc}')\n"
    )


TECHNIQUES = [
    Technique("neighbours.ptrace", "neighbours", "ptrace-attach a host canary process",
              python("ret, err = sc(101, 0x4206, H['pid'], 0, 0)\n"
                     "report(ret == 0, f'PTRACE_SEIZE {H[\"pid\"]}: ret={ret} {err}')\n")),
    Technique("neighbours.proc_mem", "neighbours", "open /proc/<host pid>/mem",
              python("fd, err = try_open(f'/proc/{H[\"pid\"]}/mem', os.O_RDWR)\n"
                     "report(fd is not None, err or 'opened')\n")),
    Technique("neighbours.signal", "neighbours", "SIGKILL a host canary process",
              python("ret, err = sc(62, H['pid'], 9)\nreport(ret == 0, f'ret={ret} {err}')\n")),
    Technique("neighbours.sysv_ipc", "neighbours", "attach the host's SysV shm and msg canaries",
              python("shm, e1 = sc(29, H['sysv_key'], 0, 0)\nmsg, e2 = sc(68, H['sysv_key'], 0)\n"
                     "report(shm >= 0 or msg >= 0, f'shmget={shm} {e1} msgget={msg} {e2}')\n"),
              # keys looked up in the sandbox's own IPC namespace (answered ENOENT).
              leaves=frozenset({"ipc"})),
    Technique("neighbours.posix_ipc", "neighbours", "see the host's POSIX shm canary",
              python("seen = os.path.exists('/dev/shm/' + H['posix_shm'])\n"
                     "report(seen, 'visible' if seen else 'not visible')\n"),
              # a look-up of /dev/shm.
              leaves=frozenset({"lookups"})),
    Technique("neighbours.abstract_socket", "neighbours", "connect to a host abstract unix socket",
              python(CONNECT + "ok, how = reach(socket.AF_UNIX, socket.SOCK_STREAM, '\\0' + H['abstract'])\n"
                     "report(ok, how)\n"),
              # a connect to a unix socket.
              leaves=frozenset({"sockets"})),
    Technique("neighbours.runtime_sockets", "neighbours", "reach docker.sock, containerd, the gateway socket",
              python(CONNECT + "hits = [p for p in H['sockets'] if reach(socket.AF_UNIX, socket.SOCK_STREAM, p)[0]]\n"
                     "report(hits, ', '.join(hits) or 'none reachable')\n"),
              # connects to unix sockets.
              leaves=frozenset({"sockets"})),
    Technique("neighbours.tiocsti", "neighbours", "push input into a terminal (TIOCSTI)",
              python(r"""
import fcntl, termios
done = []
for path in ('/dev/tty', '/proc/self/fd/0', '/dev/console'):
    fd, err = try_open(path, os.O_RDWR)
    if fd is None:
        continue
    try:
        fcntl.ioctl(fd, termios.TIOCSTI, b'#')
        done.append(path)
    except OSError:
        pass
report(done, ', '.join(done) or 'no terminal accepted input')
""")),
    Technique("network.tcp_ipv4", "network", "connect to a host TCP canary on 127.0.0.1",
              python(_loopback("AF_INET", "SOCK_STREAM", "127.0.0.1", "tcp4"))),
    Technique("network.tcp_ipv6", "network", "connect to a host TCP canary on ::1",
              python(_loopback("AF_INET6", "SOCK_STREAM", "::1", "tcp6"))),
    Technique("network.udp_ipv4", "network", "send to a host UDP canary on 127.0.0.1",
              python(_loopback("AF_INET", "SOCK_DGRAM", "127.0.0.1", "udp4"))),
    Technique("network.udp_ipv6", "network", "send to a host UDP canary on ::1",
              python(_loopback("AF_INET6", "SOCK_DGRAM", "::1", "udp6"))),
    Technique("network.dns", "network", "resolve a name through a host DNS canary on 127.0.0.1:53",
              python(r"""
if not H['dns']:
    na('127.0.0.1:53 is taken on the host: no DNS canary')
else:
    # A query sent by hand to 127.0.0.1 only: never the sandbox's resolv.conf.
    name = b''.join(bytes([len(p)]) + p for p in (H['token'].encode(), b'example')) + b'\0'
    query = struct.pack('>HHHHHH', 0x4567, 0x100, 1, 0, 0, 0) + name + struct.pack('>HH', 1, 1)
    try:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(1.0)
        s.sendto(query, ('127.0.0.1', 53))
        answer = s.recv(512)
        report(True, f'answered ({len(answer)} bytes)')
    except OSError as exc:
        report(False, f'no answer: {exc}')
""")),
    # The gateway's boundary device (backends/egress/; for gVisor, its link to the
    # sinkhole) is the sandbox's recorder and sink, not a way out: the canary
    # probes above prove nothing passes it.
    Technique("network.interfaces", "network", "see any network interface but loopback",
              python(f"names = [n for _, n in socket.if_nameindex() if n not in ('lo', {TUN_NAME!r}, {VETH_LINK!r})]\n"
                     "report(names, ', '.join(names) or 'only lo')\n")),
    Technique("network.raw", "network", "open a raw IP socket", python(_socket(2, 3, 1))),
    Technique("network.packet", "network", "open a packet socket", python(_socket(17, 3, 0x0300))),
    Technique("network.netlink", "network", "open audit / uevent netlink sockets",
              python(r"""
made = []
for proto in (9, 15):
    try:
        s = socket.socket(16, socket.SOCK_RAW, proto)
        s.bind((0, 1 if proto == 15 else 0))
        made.append(proto)
    except OSError:
        pass
report(made, f'netlink protocols opened: {made}')
""")),
    Technique("network.vsock", "network", "open a vsock socket to the hypervisor", python(_socket(40, 1, 0))),
]  # fmt: skip
