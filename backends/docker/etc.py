"""A sandbox container's /etc/hosts, /etc/hostname and /etc/resolv.conf, generated.

Left to itself the engine bind-mounts its own copies from its data root
(`/var/lib/docker/containers/<id>/...`), so the sandbox's /proc/self/mountinfo
names the engine's layout and the container's id. The backend instead writes
these three files once per start (as nsjail's generated /etc) into a private
directory on the host's /dev/shm, and the create request mounts them read-only
over the engine's (a mount of the user's own at those paths makes the engine
skip its files). /dev/shm is a tmpfs, so the sandbox's mount table shows only the
path inside it, never a host directory.

Blocking: called on a thread at start and close.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from backends.docker.reaper import process_start

HOSTNAME = "sandbox"
FILES = ("hosts", "hostname", "resolv.conf")
PREFIX = "execgate-etc-"
OWNER = ".owner"  # "pid start-time" of the gateway process (never mounted)
SHM = Path("/dev/shm")


def etc_files(nameserver: str) -> dict[str, str]:
    """The three files, for a sandbox whose resolver answers at `nameserver`."""
    return {
        "hosts": f"127.0.0.1\tlocalhost {HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n",
        "hostname": f"{HOSTNAME}\n",
        "resolv.conf": f"nameserver {nameserver}\noptions timeout:1 attempts:1\n",
    }


def make_etc_dir(nameserver: str) -> Path:
    """A fresh, randomly named directory (0755, files 0644) holding the files, and
    who made it (so a later start can remove a dead gateway's)."""
    base = SHM if SHM.is_dir() else Path(tempfile.gettempdir())
    reap_etc_dirs(base)
    path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=base))
    os.chmod(path, 0o755)
    (path / OWNER).write_text(_owner(os.getpid()), encoding="ascii")
    for name, content in etc_files(nameserver).items():
        (path / name).write_text(content, encoding="ascii")
        os.chmod(path / name, 0o644)
    return path


def remove_etc_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def reap_etc_dirs(base: Path) -> None:
    """Remove the directories of gateway processes that are gone."""
    for entry in base.glob(PREFIX + "*"):
        try:
            owner = (entry / OWNER).read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError):
            continue  # not ours, or being made right now
        pid = owner.partition(" ")[0]
        if pid.isdigit() and _owner(int(pid)) != owner and not entry.is_symlink():
            remove_etc_dir(entry)


def _owner(pid: int) -> str:
    return f"{pid} {process_start(pid)}"
