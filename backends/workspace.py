"""Per-execution host directories: one size-capped tmpfs holding everything.

Layout of one execution's tmpfs (owned by the sandbox uid, mode 0700):

    code/        root-owned, read-only in the jail at /code (the program file; a
                 FIFO until hand-over when the interpreter was started ahead)
    workspace/   the jail's cwd and $HOME, input files, output files
    tmp/         the jail's /tmp
    shm/         the jail's /dev/shm

One tmpfs means one disk cap (`disk_mb`) for all of them. It is mounted with
mount(2) through ctypes (no helper process), made before the request (at the
backend's maximum size), then shrunk to the request's size and filled with its
code and files (`fill`), and lazily unmounted afterwards. All functions here
block; the backend calls them in a worker thread.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import shutil
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from backends.base import InputFile, OutputFile
from backends.handover import Staged, hand_over_nothing, is_fifo, place_fifo, stage

MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MNT_DETACH = 2
MAX_DEPTH = 32


class WorkspaceError(Exception):
    """The workspace could not be created or removed (or input files are invalid)."""


@dataclass(slots=True)
class Workspace:
    root: Path
    # Input paths -> sha256 of their content, to leave unchanged inputs out of outputs.
    inputs: dict[str, bytes] = field(default_factory=dict)

    @property
    def code_dir(self) -> Path:
        return self.root / "code"

    @property
    def workspace_dir(self) -> Path:
        return self.root / "workspace"

    @property
    def tmp_dir(self) -> Path:
        return self.root / "tmp"

    @property
    def shm_dir(self) -> Path:
        return self.root / "shm"


@dataclass(frozen=True, slots=True)
class Collected:
    files: tuple[OutputFile, ...]
    skipped: tuple[str, ...]  # why some files were left out (for events)


def checked_relative(path: str) -> PurePosixPath:
    """A safe relative path inside the workspace, or WorkspaceError."""
    if not path or "\x00" in path or path.startswith("/") or "\\" in path:
        raise WorkspaceError(f"input file path {path!r} is not a plain relative path")
    # Checked on the raw string: PurePosixPath would quietly normalise "a//b", "./a".
    parts = path.split("/")
    if any(part in ("", ".", "..") for part in parts) or len(parts) > MAX_DEPTH:
        raise WorkspaceError(f"input file path {path!r} is not a plain relative path")
    return PurePosixPath(path)


class WorkspaceManager:
    def __init__(self, runs_dir: Path, uid: int, gid: int, inodes_per_mb: int = 256) -> None:
        self.runs_dir = runs_dir
        self.uid = uid
        self.gid = gid
        self.inodes_per_mb = inodes_per_mb
        self._libc = ctypes.CDLL(None, use_errno=True)

    def prepare(self) -> None:
        # 0711: the sandbox uid must traverse to its bind-mount sources while
        # nsjail sets up the jail, but may not list other executions.
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.runs_dir, 0o711)

    # --- mount ---------------------------------------------------------------

    def _mount_tmpfs(self, target: Path, disk_mb: int, remount: bool = False) -> None:
        inodes = max(1024, disk_mb * self.inodes_per_mb)
        data = f"size={disk_mb}m,nr_inodes={inodes}"
        if not remount:
            data += f",mode=0700,uid={self.uid},gid={self.gid}"
        # A remount changes the superblock: the jail's bind mounts shrink too.
        flags = MS_NOSUID | MS_NODEV | (MS_REMOUNT if remount else 0)
        rc = self._libc.mount(b"tmpfs", os.fsencode(target), b"tmpfs", flags, data.encode())
        if rc != 0:
            err = ctypes.get_errno()
            raise WorkspaceError(f"mount tmpfs on {target}: {os.strerror(err)}")

    def _umount(self, target: Path) -> None:
        if self._libc.umount2(os.fsencode(target), MNT_DETACH) != 0:
            err = ctypes.get_errno()
            if err not in (errno.EINVAL, errno.ENOENT):  # not mounted / gone
                raise WorkspaceError(f"umount {target}: {os.strerror(err)}")

    # --- lifecycle -------------------------------------------------------------

    def create(self, name: str, disk_mb: int) -> Workspace:
        """The empty directories, on a tmpfs of `disk_mb`."""
        root = self.runs_dir / name
        root.mkdir(mode=0o700)
        try:
            self._mount_tmpfs(root, disk_mb)
            ws = Workspace(root=root)
            os.mkdir(ws.code_dir, 0o755)
            for directory, mode in ((ws.workspace_dir, 0o755), (ws.tmp_dir, 0o1777),
                                    (ws.shm_dir, 0o1777)):  # fmt: skip
                os.mkdir(directory)
                os.chown(directory, self.uid, self.gid)
                os.chmod(directory, mode)
        except BaseException:
            self.destroy_path(root)
            raise
        return ws

    def fill(
        self,
        ws: Workspace,
        disk_mb: int,
        code_filename: str,
        code: bytes,
        files: tuple[InputFile, ...] = (),
        handover: bytes | None = None,
    ) -> Staged | None:
        """Shrink to the request's disk size, then write its input files and its
        code: in place, or (`handover`: what the interpreter reads) staged beside
        the FIFO an interpreter started ahead waits on (backends/handover.py)."""
        self._mount_tmpfs(ws.root, disk_mb, remount=True)
        path = ws.code_dir / code_filename
        staged = None
        try:
            if handover is None or not is_fifo(path):
                _write_file(path, code, 0o644)
            else:
                staged = stage(path, code, handover, _write_code)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise WorkspaceError("the code does not fit in the disk limit") from exc
            raise
        try:
            for item in files:
                self._write_input(ws, item)
        except BaseException:
            if staged is not None:
                staged.close()
            raise
        return staged

    def place_fifo(self, ws: Workspace, code_filename: str) -> None:
        """Where an interpreter started ahead waits for its code."""
        place_fifo(ws.code_dir / code_filename)

    def hand_over_nothing(self, ws: Workspace, code_filename: str) -> None:
        """An empty program for an interpreter started ahead that was never used."""
        hand_over_nothing(ws.code_dir / code_filename, _write_code)

    def _write_input(self, ws: Workspace, item: InputFile) -> None:
        rel = checked_relative(item.path)
        if rel.as_posix() in ws.inputs:
            raise WorkspaceError(f"input file {item.path!r} given twice")
        directory = ws.workspace_dir
        for part in rel.parts[:-1]:
            directory = directory / part
            if not directory.exists():
                os.mkdir(directory, 0o755)
                os.chown(directory, self.uid, self.gid)
            elif directory.is_symlink() or not directory.is_dir():
                raise WorkspaceError(f"input file {item.path!r} collides with another")
        target = ws.workspace_dir / rel
        try:
            _write_file(target, item.content, 0o644, self.uid, self.gid)
        except FileExistsError:
            raise WorkspaceError(f"input file {item.path!r} collides with another") from None
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise WorkspaceError("input files do not fit in the disk limit") from exc
            raise
        ws.inputs[rel.as_posix()] = hashlib.sha256(item.content).digest()

    def disk_full(self, ws: Workspace) -> bool:
        try:
            st = os.statvfs(ws.root)
        except OSError:
            return False
        return st.f_bavail == 0 or st.f_favail == 0

    def collect(
        self, ws: Workspace, max_files: int, max_file_bytes: int, max_total_bytes: int
    ) -> Collected:
        """Regular files of the workspace, never following links. Call only once
        every sandbox process is dead: then nothing can swap a file under us."""
        files: list[OutputFile] = []
        skipped: list[str] = []
        total = 0
        for rel, path in _walk_regular_files(ws.workspace_dir, skipped):
            digest_wanted = rel in ws.inputs
            if len(files) >= max_files:
                skipped.append(f"{rel}: more than {max_files} output files")
                continue
            content = _read_regular(path, max_file_bytes)
            if content is None:
                skipped.append(f"{rel}: not a regular file or over {max_file_bytes} bytes")
                continue
            if digest_wanted and hashlib.sha256(content).digest() == ws.inputs[rel]:
                continue  # an input file, unchanged
            if total + len(content) > max_total_bytes:
                skipped.append(f"{rel}: output files over {max_total_bytes} bytes in total")
                continue
            total += len(content)
            files.append(OutputFile(path=rel, size=len(content), content=content))
        return Collected(files=tuple(files), skipped=tuple(skipped))

    def destroy(self, ws: Workspace) -> None:
        self.destroy_path(ws.root)

    def destroy_path(self, root: Path) -> None:
        self._umount(root)
        try:
            os.rmdir(root)
        except FileNotFoundError:
            return
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                raise WorkspaceError(f"cannot remove {root}: {exc}") from exc
            # Left by a crash before the tmpfs was mounted: plain files on disk.
            shutil.rmtree(root)

    def names(self) -> set[str]:
        try:
            return {e.name for e in os.scandir(self.runs_dir)}
        except FileNotFoundError:
            return set()

    def reap(self, keep: Callable[[str], bool]) -> list[str]:
        """Unmount and delete every execution directory whose name `keep` rejects."""
        reaped = []
        for name in sorted(self.names()):
            if not keep(name):
                self.destroy_path(self.runs_dir / name)
                reaped.append(name)
        return reaped


def _write_file(path: Path, content: bytes, mode: int, uid: int = -1, gid: int = -1) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    try:
        if uid >= 0:
            os.fchown(fd, uid, gid)
        view = memoryview(content)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _write_code(path: Path, content: bytes) -> None:
    _write_file(path, content, 0o644)  # root-owned, read-only in the jail


def _walk_regular_files(top: Path, skipped: list[str]) -> list[tuple[str, Path]]:
    found: list[tuple[str, Path]] = []
    stack: list[tuple[Path, str, int]] = [(top, "", 0)]
    while stack:
        directory, prefix, depth = stack.pop()
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            rel = prefix + entry.name
            try:
                rel.encode("utf-8")
            except UnicodeEncodeError:
                skipped.append(f"{rel!r}: file name is not UTF-8")
                continue
            if entry.is_dir(follow_symlinks=False):
                if depth < MAX_DEPTH:
                    stack.append((Path(entry.path), rel + "/", depth + 1))
            elif entry.is_file(follow_symlinks=False):
                found.append((rel, Path(entry.path)))
            else:
                skipped.append(f"{rel}: not a regular file")
    found.sort()
    return found


def _read_regular(path: Path, max_bytes: int) -> bytes | None:
    """The file's bytes if it is a regular file (not a link) of at most max_bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > max_bytes:
            return None
        chunks = []
        remaining = max_bytes + 1
        while remaining > 0:
            chunk = os.read(fd, min(remaining, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = b"".join(chunks)
        return data if len(data) <= max_bytes else None
    finally:
        os.close(fd)
