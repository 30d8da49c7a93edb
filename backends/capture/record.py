"""One execution's behaviour record: files, programs, signals and refused system
calls, bounded in count and bytes.

A tracer (host eBPF for nsjail and runc, gVisor's own syscall trace) feeds raw
events into a `BehaviourRecorder`; `finish()` returns the frozen `Behaviour` the
result and the audit log carry. Identical attempts fold into one entry with a
count, so a loop of a million failed opens is one entry; past the caps, entries
are only counted in `dropped`, so a flood costs bounded memory. What the runtime
itself does at start-up (its library loads, its probes for optional files) is
learnt per runtime as a `Baseline` and left out, so a plain `print(1)` yields an
empty record and a reviewer reads only what the code did.
"""

from __future__ import annotations

import errno as errno_names
from dataclasses import dataclass, field
from typing import Any

MAX_FILES = 256
MAX_PROGRAMS = 64
MAX_SIGNALS = 64
MAX_SYSCALL_NAMES = 64
MAX_BYTES = 64 * 1024
MAX_PATH = 512
MAX_ARGS = 16
MAX_ARG = 256
ENTRY_OVERHEAD = 48

# File operations a record names.
FILE_OPS = ("open", "read", "create", "write", "rename", "unlink", "mkdir", "rmdir", "exec",
            "stat", "connect", "chmod", "chown", "mknod", "ipc")  # fmt: skip
# The kinds of attempt a record can hold; a backend says which it captures
# (SandboxBackend.recorded_kinds) and the escape suite which each technique leaves.
KINDS = ("files", "lookups", "sockets", "ipc", "programs", "signals", "syscalls")
# File operations that are kinds of their own: a look-up (stat, access, readlink),
# a connect to a unix socket and a SysV IPC object asked for by key (its "path" is
# ipc_name's); every other one is "files".
FILE_KINDS = {"stat": "lookups", "connect": "sockets", "ipc": "ipc"}
# Where a successful read is worth a reviewer's eye (the runtime's own read-only
# files and the workspace are not).
SENSITIVE_PREFIXES = ("/proc", "/sys", "/etc", "/dev", "/root", "/home", "/var", "/run", "/boot")
# The runtimes' own read-only directories: a failed look-up there (the loader
# searching its library path, locale probes of every program started, a shell
# searching PATH) is the same for every tenant and holds nothing to find, so it is
# not kept either.
RUNTIME_PREFIXES = ("/usr", "/lib", "/lib64", "/bin", "/sbin")
# Devices every runtime opens for its stdio or randomness: opening them is not news.
PLAIN_DEVICES = frozenset({"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"})


def errno_name(code: int) -> str:
    """ "ok" for 0 (or a positive return), else the symbolic name ("ENOENT")."""
    if code >= 0:
        return "ok"
    return errno_names.errorcode.get(-code, f"E{-code}")


def sensitive(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in SENSITIVE_PREFIXES)


def runtime_lookup(op: str, path: str, result: str) -> bool:
    return (
        op in ("open", "stat")
        and result == "ENOENT"
        and any(path.startswith(p + "/") for p in RUNTIME_PREFIXES)
    )


def ipc_name(kind: str, key: int) -> str:
    """A SysV IPC object as a record names it: "shm:0x0000c0de" (kind shm, msg, sem)."""
    return f"{kind}:0x{key & 0xFFFFFFFF:08x}"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True, slots=True)
class FileAttempt:
    op: str  # one of FILE_OPS
    path: str
    result: str  # "ok" or an errno name
    count: int = 1


@dataclass(frozen=True, slots=True)
class ProgramAttempt:
    path: str
    argv: tuple[str, ...]
    result: str
    count: int = 1


@dataclass(frozen=True, slots=True)
class SignalAttempt:
    syscall: str  # "kill", "tgkill", "ptrace", "process_vm_readv" ...
    target: int  # the pid as the sandbox names it
    signal: int  # the signal number (kill) or the ptrace request
    result: str
    count: int = 1


@dataclass(frozen=True, slots=True)
class Behaviour:
    """What the code tried beyond the network, as the result and audit log show it."""

    capture: str = "off"  # "on", or "off" with the reason
    reason: str = ""
    tracer: str = ""  # "bpftrace", "gvisor-strace"
    files: tuple[FileAttempt, ...] = ()
    programs: tuple[ProgramAttempt, ...] = ()
    signals: tuple[SignalAttempt, ...] = ()
    syscalls_refused: tuple[tuple[str, int], ...] = ()  # (name, count), by name
    dropped: int = 0

    @property
    def empty(self) -> bool:
        return not (self.files or self.programs or self.signals or self.syscalls_refused)

    def kinds(self) -> frozenset[str]:
        """The kinds of attempt this record holds (KINDS)."""
        found = {FILE_KINDS.get(f.op, "files") for f in self.files}
        if self.programs:
            found.add("programs")
        if self.signals:
            found.add("signals")
        if self.syscalls_refused:
            found.add("syscalls")
        return frozenset(found)

    def as_dict(self) -> dict[str, Any]:
        return {
            "capture": self.capture,
            "reason": self.reason,
            "tracer": self.tracer,
            "files": [
                {"op": f.op, "path": f.path, "result": f.result, "count": f.count}
                for f in self.files
            ],
            "programs": [
                {"path": p.path, "argv": list(p.argv), "result": p.result, "count": p.count}
                for p in self.programs
            ],
            "signals": [
                {
                    "syscall": s.syscall,
                    "target": s.target,
                    "signal": s.signal,
                    "result": s.result,
                    "count": s.count,
                }
                for s in self.signals
            ],
            "syscalls_refused": dict(self.syscalls_refused),
            "dropped": self.dropped,
        }


def capture_off(reason: str) -> Behaviour:
    return Behaviour(capture="off", reason=reason)


@dataclass(frozen=True, slots=True)
class Baseline:
    """What a runtime does on its own at start-up, per language: (op, path, result)
    file keys, program paths and refused system calls (a runtime's probe for one
    its kernel lacks, gVisor's rseq) a record leaves out."""

    files: frozenset[tuple[str, str, str]] = frozenset()
    programs: frozenset[str] = frozenset()
    syscalls: frozenset[str] = frozenset()

    @classmethod
    def learn(cls, *seen: Behaviour) -> Baseline:
        """From the records of runs of a program that does nothing (one or more:
        what any of them did is the runtime's, not the code's)."""
        files = {(f.op, f.path, f.result) for b in seen for f in b.files}
        programs = {p.path for b in seen for p in b.programs}
        syscalls = {name for b in seen for name, _ in b.syscalls_refused}
        return cls(frozenset(files), frozenset(programs), frozenset(syscalls))


@dataclass
class BehaviourRecorder:
    """Folds a tracer's events for one execution into a bounded `Behaviour`."""

    tracer: str
    baseline: Baseline = field(default_factory=Baseline)
    max_files: int = MAX_FILES
    max_programs: int = MAX_PROGRAMS
    max_signals: int = MAX_SIGNALS
    max_bytes: int = MAX_BYTES
    dropped: int = 0
    bytes: int = 0
    _files: dict[tuple[str, str, str], int] = field(default_factory=dict)
    _programs: dict[tuple[str, tuple[str, ...], str], int] = field(default_factory=dict)
    _signals: dict[tuple[str, int, int, str], int] = field(default_factory=dict)
    _refused: dict[str, int] = field(default_factory=dict)
    _first_exec_seen: bool = False

    def _room(self, size: int) -> bool:
        if self.bytes + size + ENTRY_OVERHEAD > self.max_bytes:
            self.dropped += 1
            return False
        self.bytes += size + ENTRY_OVERHEAD
        return True

    def file(self, op: str, path: str, ret: int) -> None:
        """A file operation and its return (negative errno on failure). A successful
        open or read outside the sensitive places is the runtime's business: not kept."""
        result = errno_name(ret)
        if result == "ok" and op in ("open", "read") and not sensitive(path):
            return
        if result == "ok" and op == "stat":
            return  # a look-up that found its file: only failed probes tell
        if runtime_lookup(op, path, result) or (result == "ok" and path in PLAIN_DEVICES):
            return
        key = (op, _clip(path, MAX_PATH), result)
        if key in self.baseline.files:
            return
        if key in self._files:
            self._files[key] += 1
        elif len(self._files) >= self.max_files:
            self.dropped += 1
        elif self._room(len(key[1])):
            self._files[key] = 1

    def program(self, path: str, argv: list[str] | tuple[str, ...], ret: int) -> None:
        key = (
            _clip(path, MAX_PATH),
            tuple(_clip(a, MAX_ARG) for a in list(argv)[:MAX_ARGS]),
            errno_name(ret),
        )
        if key[0] in self.baseline.programs and key[2] == "ok" and not self._first_exec_seen:
            # The sandbox's own start of the runtime (its first exec) is not the code's.
            self._first_exec_seen = True
            return
        if key in self._programs:
            self._programs[key] += 1
        elif len(self._programs) >= self.max_programs:
            self.dropped += 1
        elif self._room(len(key[0]) + sum(len(a) for a in key[1])):
            self._programs[key] = 1

    def signal(self, syscall: str, target: int, signal: int, ret: int) -> None:
        key = (syscall, target, signal, errno_name(ret))
        if key in self._signals:
            self._signals[key] += 1
        elif len(self._signals) >= self.max_signals:
            self.dropped += 1
        elif self._room(len(syscall)):
            self._signals[key] = 1

    def refused(self, syscall: str, count: int = 1) -> None:
        if syscall in self.baseline.syscalls:
            return
        if syscall in self._refused:
            self._refused[syscall] += count
        elif len(self._refused) >= MAX_SYSCALL_NAMES:
            self.dropped += count
        else:
            self._refused[syscall] = count

    def finish(self) -> Behaviour:
        return Behaviour(
            capture="on",
            tracer=self.tracer,
            files=tuple(
                FileAttempt(op, path, res, n) for (op, path, res), n in self._files.items()
            ),
            programs=tuple(
                ProgramAttempt(path, argv, res, n)
                for (path, argv, res), n in self._programs.items()
            ),
            signals=tuple(
                SignalAttempt(sc, tgt, sig, res, n)
                for (sc, tgt, sig, res), n in self._signals.items()
            ),
            syscalls_refused=tuple(sorted(self._refused.items())),
            dropped=self.dropped,
        )
