"""gVisor's own trace of a sandbox, read into a behaviour record.

docker-gvisor's programs run on gVisor's kernel (the Sentry), not the host's, so a
host tracer would see only the Sentry. The Sentry traces itself: runsc's
`--strace` with `--strace-syscalls` logs each listed system call on exit with its
decoded arguments (paths, argv) and its return value, and with `--debug` every
call its seccomp filter (the container's profile, `--oci-seccomp`) refused;
unimplemented calls are logged at any level. The runtime `runsc-capture`
(deploy/docker/runsc-capture, registered by start-dockerd.sh) writes that log,
JSON lines, to a directory per container on the host: the Sentry writes it, the
sandboxed code cannot reach it.

This build of runsc (2022-12) also has runtime monitoring (`runsc trace`, a remote
sink), but its schematized points decode paths only for open(at), creat, execve
and chdir (rename, unlink, mkdir, kill are raw registers), and neither it nor the
strace sees a call the seccomp filter refused: the strace log has both.

Lines the code can shape (paths, argv, its own command name) are JSON-escaped by
the Sentry, so a path with a newline is still one line; within a line a path can
only blur its own fields (a comma inside a path), never make another event.
"""

from __future__ import annotations

import ast
import contextlib
import ctypes
import functools
import json
import os
import re
import signal as signals
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backends.capture.record import BehaviourRecorder, ipc_name
from backends.capture.syscalls import call_name

TRACER = "gvisor-strace"
# The calls the capture runtime must trace (start-dockerd.sh writes the same list).
TRACED = (
    "open", "openat", "creat", "rename", "renameat", "renameat2", "unlink", "unlinkat",
    "mkdir", "mkdirat", "rmdir", "link", "linkat", "symlink", "symlinkat", "truncate",
    "execve", "execveat", "kill", "tkill", "tgkill", "ptrace", "process_vm_readv",
    "process_vm_writev", "pidfd_send_signal", "rt_sigqueueinfo", "rt_tgsigqueueinfo",
    "chdir", "fchdir",
    # Look-ups (failures are kept), unix-socket connects, mode and owner changes,
    # device nodes. faccessat2 is not here: this build's strace has no such name, so
    # a failed faccessat2 (glibc's faccessat tries it first) is not recorded.
    "stat", "lstat", "newfstatat", "statx", "access", "faccessat", "readlink",
    "readlinkat", "connect", "chmod", "fchmodat", "chown", "lchown", "fchownat",
    "mknod", "mknodat", "shmget", "msgget", "semget",
)  # fmt: skip
# What the capture runtime's args must hold (backends/docker/gvisor.py checks them).
REQUIRED_ARGS = ("--strace", "--debug")
# The launcher, PID 1 of every docker sandbox: what it does is not the code's.
LAUNCHER_TGID = 1
# Bytes of a trace parsed per execution; past them only the exits are counted (a
# flood of failed opens costs the gateway bounded CPU and memory).
PARSE_BYTES = 32 * 1024 * 1024
READ_CHUNK = 1 << 20
AT_REMOVEDIR = 0x200
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
PAGE = 4096


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    return libc


# "[ tgid: tid] comm X name(args) = ret (0xret)[ errno=N (text)] (duration)"
TASK = re.compile(r"\[\s*(\d+):\s*(\d+)\] (.*)\Z", re.S)
EXIT_TAIL = re.compile(r"\) = (-?\d+) \(0x[0-9a-f]+\)(?: errno=(\d+) \([^()]*\))? \([^()]*\)\Z")
EXIT_HEAD = re.compile(r" X (\w+)\(")
COMM_MAX = 15  # TASK_COMM_LEN - 1: a forged " X name(" inside the name comes earlier
DENIED = re.compile(r"Syscall (\d+): denied by seccomp\Z")
UNSUPPORTED = re.compile(r"Unsupported syscall (\w+)\(")

_FD = r"(?:AT_FDCWD|0x[0-9a-f]+|-?\d+)"
_PATH = r"0x[0-9a-f]+ (?P<{}>.*)"
_DIRFD = _FD + r"(?: (?P<{}>.*?))?"
_WORD = r"(?P<{}>[\w|]+)"
_NUM = r"(?P<{}>0x[0-9a-f]+|-?\d+)"
_SIG = r"(?P<{}>\w+)"


def _args(*parts: str) -> re.Pattern[str]:
    return re.compile(", ".join(parts) + r"\Z", re.S)


def _fields(*spec: tuple[str, str]) -> re.Pattern[str]:
    return _args(*(kind.format(name) for kind, name in spec))


PATH1, PATH2 = (_PATH, "path"), (_PATH, "path2")
DIR1 = (_DIRFD, "dir")
# The second directory fd of renameat(2), linkat(2): printed as a number, its path
# only sometimes; AT_FDCWD (-100) means the working directory.
DIR2 = (r"(?P<fd2>AT_FDCWD|0x[0-9a-f]+|-?\d+)(?: (?P<{}>.*?))?", "dir2")
AT_FDCWD_FORMS = ("AT_FDCWD", "0xffffff9c", "0xffffffffffffff9c", "-100")
ANY = r"[^,]*"
FORMS: dict[str, re.Pattern[str]] = {
    "open": _fields(PATH1, (_WORD, "flags"), (ANY, "")),
    "openat": _fields(DIR1, PATH1, (_WORD, "flags"), (ANY, "")),
    "creat": _fields(PATH1, (ANY, "")),
    "truncate": _fields(PATH1, (ANY, "")),
    "unlink": _fields(PATH1),
    "rmdir": _fields(PATH1),
    "unlinkat": _fields(DIR1, PATH1, (_NUM, "flags")),
    "mkdir": _fields(PATH1, (ANY, "")),
    "mkdirat": _fields(DIR1, PATH1, (ANY, "")),
    "rename": _fields(PATH1, PATH2),
    "link": _fields(PATH1, PATH2),
    "symlink": _fields(PATH1, PATH2),
    "renameat": _fields(DIR1, PATH1, DIR2, PATH2),
    "renameat2": _fields(DIR1, PATH1, DIR2, PATH2, (ANY, "")),
    "linkat": _fields(DIR1, PATH1, DIR2, PATH2, (ANY, "")),
    "symlinkat": _fields(PATH1, DIR2, PATH2),
    "kill": _fields((_NUM, "pid"), (_SIG, "sig")),
    "tkill": _fields((_NUM, "pid"), (_SIG, "sig")),
    "tgkill": _fields((_NUM, "pid"), (_NUM, "tid"), (_SIG, "sig")),
    "rt_sigqueueinfo": _fields((_NUM, "pid"), (_SIG, "sig"), (ANY, "")),
    "rt_tgsigqueueinfo": _fields((_NUM, "pid"), (_NUM, "tid"), (_SIG, "sig"), (ANY, "")),
    "pidfd_send_signal": _fields((r"(?P<{}>.*)", "pid"), (_SIG, "sig"), (ANY, ""), (ANY, "")),
    "ptrace": _fields((_SIG, "sig"), (_NUM, "pid"), (ANY, ""), (ANY, "")),
    # Look-ups: a failed one prints its buffer as a bare address; a successful one
    # (whose struct has commas, and which a record does not keep) does not match.
    "stat": _fields(PATH1, (ANY, "")),
    "lstat": _fields(PATH1, (ANY, "")),
    "newfstatat": _fields(DIR1, PATH1, (ANY, ""), (ANY, "")),
    "statx": _fields(DIR1, PATH1, (ANY, ""), (ANY, ""), (ANY, "")),
    "access": _fields(PATH1, (ANY, "")),
    "faccessat": _fields(DIR1, PATH1, (ANY, "")),
    "readlink": _fields(PATH1, (ANY, ""), (ANY, "")),
    "readlinkat": _fields(DIR1, PATH1, (ANY, ""), (ANY, "")),
    "chmod": _fields(PATH1, (ANY, "")),
    "fchmodat": _fields(DIR1, PATH1, (ANY, "")),
    "chown": _fields(PATH1, (ANY, ""), (ANY, "")),
    "lchown": _fields(PATH1, (ANY, ""), (ANY, "")),
    "fchownat": _fields(DIR1, PATH1, (ANY, ""), (ANY, ""), (ANY, "")),
    "mknod": _fields(PATH1, (ANY, ""), (ANY, "")),
    "mknodat": _fields(DIR1, PATH1, (ANY, ""), (ANY, "")),
    "process_vm_readv": re.compile(r"(?P<pid>0x[0-9a-f]+|-?\d+), .*\Z", re.S),
    "process_vm_writev": re.compile(r"(?P<pid>0x[0-9a-f]+|-?\d+), .*\Z", re.S),
}
EXEC = re.compile(
    r"(?:" + _FD + r"(?: .*?)?, )?0x[0-9a-f]+ (?P<path>.*?), 0x[0-9a-f]+ \[(?P<argv>.*?)\], "
    r"0x[0-9a-f]+ \[.*\Z",
    re.S,
)
# connect(2) to a unix socket: the address as Go quotes it (an abstract name starts
# with a NUL and is cut to the address length). Other families are the network's.
CONNECT_UNIX = re.compile(
    r"(?:0x[0-9a-f]+|-?\d+)(?: .*?)?, 0x[0-9a-f]+ \{Family: AF_UNIX, Addr: (?P<addr>\".*\")\}, "
    r"(?:0x[0-9a-f]+|\d+)\Z",
    re.S,
)
# SysV IPC gets: the key first (IPC_PRIVATE, 0, asks for no one's object).
IPC_GET = re.compile(r"(?P<key>0x[0-9a-f]+|-?\d+), .*\Z", re.S)
# The calls a record names by another operation.
OPS = {"creat": "create", "truncate": "write", "mkdirat": "mkdir", "fchmodat": "chmod",
       "lchown": "chown", "fchownat": "chown", "mknodat": "mknod",
       **dict.fromkeys(("stat", "lstat", "newfstatat", "statx", "access", "faccessat",
                        "readlink", "readlinkat"), "stat")}  # fmt: skip
QUOTED = re.compile(r'"(?:[^"\\]|\\.)*"')
PTRACE_REQUESTS = {"PTRACE_TRACEME": 0, "PTRACE_PEEKTEXT": 1, "PTRACE_PEEKDATA": 2,
                   "PTRACE_POKETEXT": 4, "PTRACE_POKEDATA": 5, "PTRACE_CONT": 7,
                   "PTRACE_KILL": 8, "PTRACE_ATTACH": 16, "PTRACE_DETACH": 17,
                   "PTRACE_SEIZE": 0x4206, "PTRACE_INTERRUPT": 0x4207}  # fmt: skip


def untraced(name: str, runtime: dict[str, Any] | None) -> str:
    """Why the engine's runtime `name` does not trace what a record needs ("": it does)."""
    if runtime is None:
        return (
            f"the engine has no runtime {name!r} (gVisor with its strace:"
            " deploy/docker/start-dockerd.sh registers it)"
        )
    args = [str(a) for a in runtime.get("runtimeArgs") or []]
    if missing := [a for a in REQUIRED_ARGS if a not in args]:
        return f"runtime {name!r} lacks {' '.join(missing)}"
    listed = [a.split("=", 1)[1] for a in args if a.startswith("--strace-syscalls=")]
    if listed and (untraced := sorted(set(TRACED) - set(listed[-1].split(",")))):
        return f"runtime {name!r} does not trace {', '.join(untraced)}"
    return ""


def _int(text: str) -> int:
    with contextlib.suppress(ValueError):
        return int(text, 0)
    return -1


def _signal(text: str) -> int:
    if text in PTRACE_REQUESTS:
        return PTRACE_REQUESTS[text]
    with contextlib.suppress(KeyError):
        return int(signals.Signals[text])
    return _int(text)


def _unquote(token: str) -> str:
    # Go's %q; Python reads the same escapes (\xNN as a code point: display only).
    try:
        value = ast.literal_eval(token)
    except (ValueError, SyntaxError):
        return token[1:-1]
    return value if isinstance(value, str) else token[1:-1]


def _join(directory: str | None, path: str) -> str:
    if path.startswith("/") or not directory or not directory.startswith("/"):
        return path
    return os.path.normpath(os.path.join(directory, path))


def _open_op(flags: str) -> str:
    names = set(flags.split("|"))
    if "O_CREAT" in names:
        return "create"
    if names & {"O_WRONLY", "O_RDWR", "O_TRUNC"}:
        return "write"
    return "open"


@dataclass
class TraceParser:
    """Feeds one sandbox's trace lines (the `msg` of each) into a recorder."""

    recorder: BehaviourRecorder
    names: dict[int, str]
    # Each process's working directory, as its last AT_FDCWD call showed it (a
    # chdir forgets it): what a relative path of rename(2) or unlink(2) is under.
    cwd: dict[int, str] = field(default_factory=dict)

    def message(self, msg: str) -> None:
        if msg.startswith("Unsupported syscall "):
            if found := UNSUPPORTED.match(msg):
                self.recorder.refused(found.group(1))
            return
        task = TASK.match(msg)
        if task is None or int(task.group(1)) == LAUNCHER_TGID:
            return
        rest = task.group(3)
        if denied := DENIED.match(rest):
            number = int(denied.group(1))
            # The log gives no architecture: an int 0x80 call shows as its x86-64
            # namesake (i386's unshare, 310, as process_vm_readv); x32's carries its flag.
            self.recorder.refused(call_name(number, self.names))
            return
        self._exit(int(task.group(1)), rest)

    def _exit(self, tgid: int, rest: str) -> None:
        tail = EXIT_TAIL.search(rest)
        if tail is None:
            return
        # The real call's " X name(" is the last one within the command name's reach.
        heads = [h for h in EXIT_HEAD.finditer(rest, 0, COMM_MAX + 32) if h.start() <= COMM_MAX]
        if not heads:
            return
        head = heads[-1]
        name, args = head.group(1), rest[head.end() : tail.start()]
        ret = -int(tail.group(2)) if tail.group(2) else int(tail.group(1))
        if name in ("execve", "execveat"):
            if found := EXEC.match(args):
                argv = [_unquote(t) for t in QUOTED.findall(found.group("argv"))]
                self.recorder.program(found.group("path"), argv, ret)
            return
        if name in ("chdir", "fchdir"):
            self.cwd.pop(tgid, None)
            return
        if name in ("shmget", "msgget", "semget"):
            if (found := IPC_GET.match(args)) and (key := _int(found.group("key"))) != 0:
                self.recorder.file("ipc", ipc_name(name[:3], key), ret)
            return
        if name == "connect":
            if found := CONNECT_UNIX.match(args):
                address = _unquote(found.group("addr"))
                if address.startswith("\x00"):
                    address = "@" + address[1:]
                self.recorder.file("connect", address, ret)
            return
        form = FORMS.get(name)
        found = form.match(args) if form is not None else None
        if found is None:
            return
        fields = found.groupdict()
        if "sig" in fields:
            self._signal(name, tgid, fields, ret)
            return
        cwd = self.cwd.get(tgid)
        if args.startswith("AT_FDCWD ") and fields.get("dir"):
            cwd = self.cwd[tgid] = fields["dir"]
        path = _join(fields.get("dir") or cwd, fields["path"])
        if "path2" in fields:
            second = fields.get("dir2")
            if second is None and fields.get("fd2", "AT_FDCWD") in AT_FDCWD_FORMS:
                second = cwd
            target = _join(second, fields["path2"])
            if name == "rename" or name.startswith("renameat"):
                self.recorder.file("rename", f"{path} -> {target}", ret)
            else:  # a link or symlink: a new file at the target
                self.recorder.file("create", target, ret)
            return
        if name in ("open", "openat"):
            op = _open_op(fields["flags"])
        elif name == "unlinkat":
            op = "rmdir" if _int(fields["flags"]) & AT_REMOVEDIR else "unlink"
        else:
            op = OPS.get(name, name)
        self.recorder.file(op, path, ret)

    def _signal(self, name: str, tgid: int, fields: dict[str, str], ret: int) -> None:
        # A pidfd names its process by a file, not a number: -1.
        pidfd = name == "pidfd_send_signal"
        target = -1 if pidfd else _int(fields["pid"].split(" ", 1)[0])
        if target == tgid and name not in ("ptrace", "process_vm_readv", "process_vm_writev"):
            return  # its own process: not aimed at another
        self.recorder.signal(name, target, _signal(fields.get("sig", "0")), ret)


def feed(parser: TraceParser, lines: Iterable[bytes]) -> None:
    for line in lines:
        # Only the lines a record reads are decoded (most are the Sentry's own).
        if b" X " not in line and b"seccomp" not in line and b"Unsupported" not in line:
            continue
        try:
            msg = json.loads(line)["msg"]
        except (ValueError, KeyError, TypeError):
            continue
        if isinstance(msg, str):
            parser.message(msg)


def trace_file(directory: Path) -> Path | None:
    """The Sentry's log in a container's trace directory (None: none written)."""
    try:
        found = sorted(p for p in directory.iterdir() if p.name.endswith(".boot.txt"))
    except OSError:
        return None
    return found[-1] if found else None


def _punch(fd: int, length: int) -> None:
    """Free the first `length` bytes of a file, keeping its size (the Sentry appends
    past them): a flood's log costs the host what is not read yet, not all of it."""
    length -= length % PAGE
    if length > 0 and (libc := _libc()) is not None:
        libc.fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, length)


class TraceTail:
    """One sandbox's trace, read as it grows from where it stood at hand-over; what
    has been read is punched out of the file. Every method blocks (run them off the
    event loop); one reader at a time."""

    def __init__(
        self, directory: Path, parser: TraceParser, parse_bytes: int = PARSE_BYTES
    ) -> None:
        self.directory = directory
        self.parser = parser
        self.budget = parse_bytes
        self.offset = 0
        self.path: Path | None = None
        self._partial = b""
        self._lock = threading.Lock()

    def mark(self) -> None:
        """From here on: what the Sentry logged before (the launcher's start) is not
        the code's."""
        self.path = trace_file(self.directory)
        self.offset = self.size()

    def size(self) -> int:
        try:
            return self.path.stat().st_size if self.path is not None else 0
        except OSError:
            return 0

    def pending(self) -> int:
        return self.size() - self.offset

    def pump(self, final: bool = False) -> bool:
        """Read what was written since the last call; past the parse budget only
        count the exits as dropped. False when there is no trace."""
        with self._lock:
            if self.path is None:
                self.path = trace_file(self.directory)
            return self._read(final)

    def last_read_if_small(self, max_bytes: int) -> bool | None:
        """The final read where the caller is (the event loop), when it is small
        (the log's tail after a short program: a few kilobytes the Sentry has just
        written, in the page cache) and no other read holds the tail; a thread's
        round trip costs ~0.3 ms here, more than such a read. None: not done (read
        it with `pump(True)` in a thread)."""
        if self.path is None or self.pending() > max_bytes:
            return None
        if not self._lock.acquire(blocking=False):
            return None  # a watch's read still runs in its thread
        try:
            return self._read(True)
        finally:
            self._lock.release()

    def _read(self, final: bool) -> bool:
        if self.path is None:
            return False
        try:
            with self.path.open("r+b") as log:
                log.seek(self.offset)
                while chunk := log.read(READ_CHUNK):
                    self.offset += len(chunk)
                    self._take(chunk)
                if not final:
                    # The final read is followed by the removal of the directory
                    # with its container: punching it then (a journalled extent
                    # change, ~0.3-0.5 ms here) would only delay the answer.
                    _punch(log.fileno(), self.offset)
        except OSError:
            return False
        if final:
            feed(self.parser, [self._partial])
            self._partial = b""
        return True

    def _take(self, chunk: bytes) -> None:
        if self.budget <= 0:
            self.parser.recorder.dropped += chunk.count(b" X ")
            return
        self.budget -= len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        feed(self.parser, lines)


def size_of(directory: Path) -> int:
    """Bytes the Sentry has written so far (0 when there is no log yet): blocking."""
    path = trace_file(directory)
    try:
        return path.stat().st_size if path is not None else 0
    except OSError:
        return 0


def read_trace(
    directory: Path, offset: int, parser: TraceParser, parse_bytes: int = PARSE_BYTES
) -> bool:
    """Feed what the Sentry wrote after `offset` into `parser` (TraceTail, once)."""
    tail = TraceTail(directory, parser, parse_bytes)
    tail.offset = offset
    return tail.pump(final=True)
