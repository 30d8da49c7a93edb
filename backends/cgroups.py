"""Per-execution cgroups, v1 and v2 behind one interface.

The backend makes one cgroup per execution itself (nsjail's own cgroup support
deletes its cgroup when it exits, so usage could not be read afterwards): it
sets the limits, has nsjail join it before nsjail clones the sandbox, reads
usage, OOM kills and pids-limit hits once everything is dead, kills whatever is
left and removes it. All calls are quick cgroupfs syscalls, except `kill_all`,
which may poll; the backend runs that one off the event loop.
"""

from __future__ import annotations

import abc
import contextlib
import errno
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

CONTROLLERS_V1 = ("memory", "pids", "cpu", "cpuacct")
CONTROLLERS_V2 = ("memory", "pids", "cpu")


class CgroupError(Exception):
    """cgroups are missing, not writable, or a cgroup would not die or go away."""


@dataclass(frozen=True, slots=True)
class CgroupLimits:
    memory_bytes: int
    pids_max: int
    cpu_quota_us: int
    cpu_period_us: int = 100_000


@dataclass(frozen=True, slots=True)
class CgroupUsage:
    cpu_ns: int = 0
    memory_peak_bytes: int = 0
    oom_kills: int = 0
    pids_max_hits: int = 0

    def since(self, baseline: CgroupUsage) -> CgroupUsage:
        """Counters accumulated after `baseline` (the peak is kept as it is)."""
        return CgroupUsage(
            cpu_ns=max(0, self.cpu_ns - baseline.cpu_ns),
            memory_peak_bytes=self.memory_peak_bytes,
            oom_kills=max(0, self.oom_kills - baseline.oom_kills),
            pids_max_hits=max(0, self.pids_max_hits - baseline.pids_max_hits),
        )


def _read(path: Path) -> str:
    # os-level, not open(): a text file object costs ~4x the reads themselves, and
    # an execution's accounting reads four of these files twice.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("ascii")


def _write(path: Path, value: str) -> None:
    # One write() of the whole value, opened like the shell's `>` (cgroupfs
    # creates nothing: a missing interface file is still an error there).
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, value.encode("ascii"))
    finally:
        os.close(fd)


def _keyed(text: str, key: str) -> int:
    """The value of `key` in a flat-keyed file ("oom_kill 3\\n...")."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value.split()[0])
    return 0


def _int_or_zero(path: Path) -> int:
    try:
        return int(_read(path).split()[0])
    except (OSError, ValueError, IndexError):
        return 0


def _keyed_or_zero(path: Path, key: str) -> int:
    try:
        return _keyed(_read(path), key)
    except (OSError, ValueError):
        return 0


def _rmdir_patiently(path: Path, timeout_s: float = 2.0) -> None:
    # A just-killed task can keep a cgroup busy for a moment.
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.rmdir(path)
            return
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.EBUSY or time.monotonic() > deadline:
                raise CgroupError(f"cannot remove cgroup {path}: {exc}") from exc
            time.sleep(0.002)


def own_cgroups(self_cgroup: Path) -> dict[str, str]:
    """controller -> path of this process's cgroup ("" is the v2 hierarchy)."""
    owned: dict[str, str] = {}
    for line in _read(self_cgroup).splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            owned[controller] = path
    return owned


class ExecCgroup(abc.ABC):
    """The cgroup of one execution."""

    def __init__(self, name: str) -> None:
        self.name = name
        # What the kernel holds, as last written here (None: unknown), so that a
        # claim whose limits a sandbox made ahead already has writes nothing.
        self.applied: CgroupLimits | None = None

    @property
    @abc.abstractmethod
    def join_files(self) -> tuple[Path, ...]:
        """Files a single-threaded process writes "0" into to join (every hierarchy)."""

    @abc.abstractmethod
    def pids(self) -> set[int]: ...

    def apply(self, limits: CgroupLimits) -> None:
        """Set (or change) the limits; raises OSError. Nothing is written when
        `limits` are already the cgroup's."""
        if limits == self.applied:
            return
        self.applied = None  # a write that fails midway leaves them unknown
        self._write_limits(limits)
        self.applied = limits

    @abc.abstractmethod
    def _write_limits(self, limits: CgroupLimits) -> None: ...

    @abc.abstractmethod
    def reset_peak(self) -> None:
        """Start memory-peak tracking afresh (best effort)."""

    @abc.abstractmethod
    def usage(self) -> CgroupUsage: ...

    @abc.abstractmethod
    def remove(self) -> None: ...

    def kill_all(self, timeout_s: float = 5.0, spare: frozenset[int] = frozenset()) -> None:
        """SIGKILL every process (but `spare`) until none is left; pids.max bounds forks."""
        deadline = time.monotonic() + timeout_s
        while pids := self.pids() - spare:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if time.monotonic() > deadline:
                raise CgroupError(f"cgroup {self.name} still has processes {sorted(pids)}")
            time.sleep(0.001)


class CgroupManager(abc.ABC):
    version: ClassVar[str]

    @abc.abstractmethod
    def prepare(self) -> None:
        """Create the parent cgroup(s); raise CgroupError naming what is missing."""

    @abc.abstractmethod
    def create(self, name: str, limits: CgroupLimits) -> ExecCgroup: ...

    @abc.abstractmethod
    def open(self, name: str) -> ExecCgroup:
        """An existing execution cgroup (for reaping)."""

    @abc.abstractmethod
    def children(self) -> set[str]: ...

    @abc.abstractmethod
    def problem(self) -> str | None:
        """Cheap health check: what is wrong, or None."""

    def reap(self, keep: Callable[[str], bool]) -> list[str]:
        """Kill and remove every execution cgroup whose name `keep` rejects."""
        reaped = []
        for name in sorted(self.children()):
            if keep(name):
                continue
            cgroup = self.open(name)
            cgroup.kill_all()
            cgroup.remove()
            reaped.append(name)
        return reaped


def _parent_path(hierarchy: Path, own: str, parent: str) -> Path:
    if parent.startswith("/"):
        return hierarchy / parent.lstrip("/")
    return hierarchy / own.lstrip("/") / parent


# --- cgroup v1 -----------------------------------------------------------------


class V1Cgroup(ExecCgroup):
    def __init__(self, name: str, dirs: dict[str, Path]) -> None:
        super().__init__(name)
        self.dirs = dirs  # controller -> directory (cpu and cpuacct may share one)

    def _unique(self) -> list[Path]:
        return list(dict.fromkeys(self.dirs.values()))

    @property
    def join_files(self) -> tuple[Path, ...]:
        # "0" into `tasks` moves the writing thread only, which lets the kernel
        # skip the global threadgroup rwsem (and its RCU grace period, ~10 ms
        # here) that any write to cgroup.procs pays. For a single-threaded
        # shim the thread is the whole process.
        return tuple(d / "tasks" for d in self._unique())

    def pids(self) -> set[int]:
        found: set[int] = set()
        for path in (d / "cgroup.procs" for d in self._unique()):
            try:
                found.update(int(p) for p in _read(path).split())
            except FileNotFoundError:
                continue
        return found

    def _write_limits(self, limits: CgroupLimits) -> None:
        memory = self.dirs["memory"]
        limit, memsw = memory / "memory.limit_in_bytes", memory / "memory.memsw.limit_in_bytes"
        # With swap accounting, memory+swap may never be below memory alone:
        # raise memsw first when growing, lower it last when shrinking.
        order = [limit]
        if memsw.exists():  # swap accounting on: no swap beyond the limit
            current = int(_read(limit).split()[0])
            order = [memsw, limit] if limits.memory_bytes > current else [limit, memsw]
        for path in order:
            _write(path, str(limits.memory_bytes))
        _write(self.dirs["pids"] / "pids.max", str(limits.pids_max))
        cpu = self.dirs["cpu"]
        _write(cpu / "cpu.cfs_period_us", str(limits.cpu_period_us))
        _write(cpu / "cpu.cfs_quota_us", str(limits.cpu_quota_us))

    def reset_peak(self) -> None:
        with contextlib.suppress(OSError):
            _write(self.dirs["memory"] / "memory.max_usage_in_bytes", "0")

    def usage(self) -> CgroupUsage:
        return CgroupUsage(
            cpu_ns=_int_or_zero(self.dirs["cpuacct"] / "cpuacct.usage"),
            memory_peak_bytes=_int_or_zero(self.dirs["memory"] / "memory.max_usage_in_bytes"),
            oom_kills=_keyed_or_zero(self.dirs["memory"] / "memory.oom_control", "oom_kill"),
            pids_max_hits=_keyed_or_zero(self.dirs["pids"] / "pids.events", "max"),
        )

    def remove(self) -> None:
        for directory in self._unique():
            _rmdir_patiently(directory)


class V1Manager(CgroupManager):
    version = "v1"

    def __init__(self, root: Path, parent: str, self_cgroup: Path) -> None:
        own = own_cgroups(self_cgroup)
        # Resolved: where cpu and cpuacct are co-mounted they share one directory.
        self.hierarchies = {c: (root / c).resolve() for c in CONTROLLERS_V1}
        self.parents = {
            c: _parent_path(h, own.get(c, "/"), parent) for c, h in self.hierarchies.items()
        }

    def _unique_parents(self) -> list[Path]:
        return list(dict.fromkeys(self.parents.values()))

    def problem(self) -> str | None:
        for controller, parent in self.parents.items():
            if not parent.is_dir():
                return f"cgroup v1 {controller} parent {parent} is missing"
        return None

    def prepare(self) -> None:
        for controller, parent in self.parents.items():
            if not (self.hierarchies[controller] / "cgroup.procs").exists():
                raise CgroupError(f"cgroup v1 controller {controller!r} is not mounted")
            try:
                parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CgroupError(f"cannot create cgroup {parent}: {exc}") from exc

    def open(self, name: str) -> V1Cgroup:
        return V1Cgroup(name, {c: p / name for c, p in self.parents.items()})

    def children(self) -> set[str]:
        names: set[str] = set()
        for parent in self._unique_parents():
            names.update(e.name for e in os.scandir(parent) if e.is_dir(follow_symlinks=False))
        return names

    def create(self, name: str, limits: CgroupLimits) -> V1Cgroup:
        cgroup = self.open(name)
        made: list[Path] = []
        try:
            for directory in cgroup._unique():
                directory.mkdir()
                made.append(directory)
            cgroup.apply(limits)
        except OSError as exc:
            for directory in reversed(made):
                _try_rmdir(directory)
            raise CgroupError(f"cannot set up cgroup {name}: {exc}") from exc
        return cgroup


# --- cgroup v2 -----------------------------------------------------------------


class V2Cgroup(ExecCgroup):
    def __init__(self, name: str, directory: Path) -> None:
        super().__init__(name)
        self.dir = directory

    @property
    def join_files(self) -> tuple[Path, ...]:
        # v2 has no per-thread fast path outside threaded subtrees; mounting
        # cgroup2 with favordynmods makes this migration cheap.
        return (self.dir / "cgroup.procs",)

    def pids(self) -> set[int]:
        try:
            return {int(p) for p in _read(self.dir / "cgroup.procs").split()}
        except FileNotFoundError:
            return set()

    def kill_all(self, timeout_s: float = 5.0, spare: frozenset[int] = frozenset()) -> None:
        kill_file = self.dir / "cgroup.kill"
        if not spare and kill_file.exists() and self.pids():
            _write(kill_file, "1")  # kernel >= 5.14: kills the whole subtree at once
        super().kill_all(timeout_s, spare)

    def _write_limits(self, limits: CgroupLimits) -> None:
        _write(self.dir / "memory.max", str(limits.memory_bytes))
        swap = self.dir / "memory.swap.max"
        if swap.exists():
            _write(swap, "0")
        _write(self.dir / "pids.max", str(limits.pids_max))
        _write(self.dir / "cpu.max", f"{limits.cpu_quota_us} {limits.cpu_period_us}")

    def reset_peak(self) -> None:
        # Writing memory.peak resets it on kernel >= 6.12; older ones refuse.
        with contextlib.suppress(OSError):
            _write(self.dir / "memory.peak", "0")

    def usage(self) -> CgroupUsage:
        return CgroupUsage(
            cpu_ns=_keyed_or_zero(self.dir / "cpu.stat", "usage_usec") * 1000,
            # memory.peak needs kernel >= 5.19; older kernels report 0.
            memory_peak_bytes=_int_or_zero(self.dir / "memory.peak"),
            oom_kills=_keyed_or_zero(self.dir / "memory.events", "oom_kill"),
            pids_max_hits=_keyed_or_zero(self.dir / "pids.events", "max"),
        )

    def remove(self) -> None:
        _rmdir_patiently(self.dir)


class V2Manager(CgroupManager):
    version = "v2"

    def __init__(self, root: Path, parent: str, self_cgroup: Path) -> None:
        self.root = root
        self.parent = _parent_path(root, own_cgroups(self_cgroup).get("", "/"), parent)

    def problem(self) -> str | None:
        if not self.parent.is_dir():
            return f"cgroup v2 parent {self.parent} is missing"
        return None

    def prepare(self) -> None:
        available = set(_read(self.root / "cgroup.controllers").split())
        missing = [c for c in CONTROLLERS_V2 if c not in available]
        if missing:
            raise CgroupError(f"cgroup v2 controllers not available: {', '.join(missing)}")
        # Each level from the root down to the parent must hand the controllers
        # on to its children; that needs a delegated subtree whose inner nodes
        # hold no processes (v2's "no internal processes" rule).
        try:
            self.parent.mkdir(parents=True, exist_ok=True)
            chain = [self.parent, *self.parent.relative_to(self.root).parents]
            for rel in reversed(chain[1:]):
                self._enable(self.root / rel)
            self._enable(self.parent)
        except OSError as exc:
            raise CgroupError(
                f"cannot delegate cgroup v2 controllers to {self.parent}: {exc}; use a"
                " delegated subtree whose inner cgroups hold no processes"
            ) from exc

    @staticmethod
    def _enable(directory: Path) -> None:
        control = directory / "cgroup.subtree_control"
        enabled = set(_read(control).split())
        wanted = [c for c in CONTROLLERS_V2 if c not in enabled]
        if wanted:
            _write(control, " ".join(f"+{c}" for c in wanted))

    def open(self, name: str) -> V2Cgroup:
        return V2Cgroup(name, self.parent / name)

    def children(self) -> set[str]:
        return {e.name for e in os.scandir(self.parent) if e.is_dir(follow_symlinks=False)}

    def create(self, name: str, limits: CgroupLimits) -> V2Cgroup:
        cgroup = self.open(name)
        try:
            cgroup.dir.mkdir()
        except OSError as exc:
            raise CgroupError(f"cannot create cgroup {cgroup.dir}: {exc}") from exc
        try:
            cgroup.apply(limits)
        except OSError as exc:
            _try_rmdir(cgroup.dir)
            raise CgroupError(f"cannot set up cgroup {name}: {exc}") from exc
        return cgroup


def _try_rmdir(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.rmdir(path)


def detect(
    root: Path = Path("/sys/fs/cgroup"),
    parent: str = "/execgate",
    version: str = "auto",
    self_cgroup: Path = Path("/proc/self/cgroup"),
) -> CgroupManager:
    """The manager for the host's cgroup layout (v2 unified, or v1 controllers)."""
    is_v2 = (root / "cgroup.controllers").exists()
    is_v1 = all((root / c).is_dir() for c in CONTROLLERS_V1)
    if version == "v2" or (version == "auto" and is_v2):
        if not is_v2:
            raise CgroupError(f"no cgroup v2 hierarchy at {root}")
        return V2Manager(root, parent, self_cgroup)
    if version == "v1" or (version == "auto" and is_v1):
        if not is_v1:
            missing = [c for c in CONTROLLERS_V1 if not (root / c).is_dir()]
            raise CgroupError(f"cgroup v1 controllers not mounted under {root}: {missing}")
        return V1Manager(root, parent, self_cgroup)
    raise CgroupError(
        f"no usable cgroups under {root}: need cgroup v2 (cgroup.controllers) or the"
        f" v1 controllers {', '.join(CONTROLLERS_V1)}"
    )


def remove_container_leftovers(
    container_id: str, root: Path = Path("/sys/fs/cgroup")
) -> list[Path]:
    """Remove the empty cgroups a container engine left for a container it no longer
    has (a runtime that failed part-way through starting it does not always remove
    them). Returns those removed; a cgroup still holding a process is kept."""
    if not container_id or "/" in container_id or container_id.startswith("."):
        return []
    names = (f"docker/{container_id}", f"system.slice/docker-{container_id}.scope")
    candidates = [root / name for name in names]
    with contextlib.suppress(OSError):
        for hierarchy in root.iterdir():
            candidates += [hierarchy / name for name in names]
    removed = []
    for path in candidates:
        if not path.is_dir():
            continue
        # Deepest first: a runtime may have nested its own cgroups inside.
        for sub in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
            _try_rmdir(sub)
        try:
            os.rmdir(path)
        except OSError:
            continue
        removed.append(path)
    return removed
