"""What one sandbox container is, as the engine's create request (pure functions).

A container is made for one *shape* (memory, CPUs, processes, disk: what the
engine fixes at creation) and runs the launcher as PID 1, as the unprivileged user,
on a read-only image with no network, no capabilities, no new privileges, the
seccomp profile, size-capped tmpfs mounts for /workspace, /tmp, /dev/shm and /code,
ulimits, and only the environment given here. No host path is mounted but the
generated /etc/hosts, /etc/hostname and /etc/resolv.conf (etc.py), read-only,
in place of the engine's own copies from its data root.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import marshal
import math
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.base import ExecSpec, Limits
from backends.docker.etc import FILES as ETC_FILES
from backends.docker.settings import DockerSettings
from backends.egress.boundary import PROXY_ENV

MIB = 1024 * 1024
LAUNCHER_SOURCE = Path(__file__).with_name("launcher.py")
# Docker's defaults, plus the host's cgroup tree (read-only, but it shows the host).
MASKED_PATHS = [
    "/proc/asound", "/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
    "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
    "/sys/firmware", "/sys/fs/cgroup",
]  # fmt: skip
LABEL_PREFIX = "execgate."
AHEAD_VARIABLE = "EXECGATE_AHEAD"  # the launcher's (launcher.py reads it by this name)
# The container's command: `python3 -I -S -c LAUNCHER_STUB <magic> <code> <source>`.
# An interpreter whose bytecode is the gateway's (the same magic number, as a .pyc
# would be checked) runs the launcher compiled here once; any other compiles the
# source. Compiling it was a sixth of each container's launcher start-up. Both are
# compressed: the engine, containerd and runc each parse and rewrite the command,
# and their JSON work grew with it (~0.15 ms of the engine's CPU per KiB, measured).
LAUNCHER_STUB = """import sys, binascii, zlib
_a = sys.argv
_m = getattr(sys.modules.get("_frozen_importlib_external"), "MAGIC_NUMBER", b"")
if _m and _m.hex() == _a[1]:
    import marshal
    _c = marshal.loads(zlib.decompress(binascii.a2b_base64(_a[2])))
else:
    _c = compile(zlib.decompress(binascii.a2b_base64(_a[3])), "launcher.py", "exec")
del _a[1:], _a, _m
exec(_c)
"""


@dataclass(frozen=True, slots=True)
class Shape:
    """What a container is created with and cannot change afterwards: its limits,
    and the language whose interpreter it starts ahead ("": none, it waits for
    the request to start one)."""

    memory_mb: int
    cpus: float
    pids: int
    disk_mb: int
    language: str = ""

    @classmethod
    def of(cls, limits: Limits, language: str = "") -> Shape:
        return cls(limits.memory_mb, limits.cpus, limits.pids, limits.disk_mb, language)


def launcher_command(source: str) -> list[str]:
    """`-c` and its arguments: the launcher compiled here (without docstrings: it
    has no asserts) and its source, both compressed."""
    code = compile(source, "launcher.py", "exec", dont_inherit=True, optimize=2)

    def packed(data: bytes) -> str:
        return base64.b64encode(zlib.compress(data, 9)).decode("ascii")

    magic = importlib.util.MAGIC_NUMBER.hex()
    return ["-c", LAUNCHER_STUB, magic, packed(marshal.dumps(code)), packed(source.encode())]


def rlimit_cpu_s(settings: DockerSettings) -> int:
    """Per-process CPU seconds: beyond any deadline at any quota (a backstop only)."""
    return math.ceil(settings.max_timeout_s * max(settings.max_cpus, 1.0)) + 1


def container_request(
    settings: DockerSettings,
    image: str,
    shape: Shape,
    labels: dict[str, str],
    launcher: Sequence[str],
    seccomp_json: str = "",
    etc_dir: str = "",
    ahead: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The engine's create request (API body) for one sandbox of `shape`; `etc_dir`
    holds the generated network files (etc.py); `ahead`, the program whose
    interpreter the launcher starts before the request (`ahead_program`)."""
    s = settings
    memory = (shape.memory_mb + s.memory_overhead_mb) * MIB
    ulimits = [
        {"Name": "core", "Soft": 0, "Hard": 0},
        {"Name": "nofile", "Soft": s.rlimit_nofile, "Hard": s.rlimit_nofile},
        {"Name": "fsize", "Soft": s.max_disk_mb * MIB, "Hard": s.max_disk_mb * MIB},
        {"Name": "cpu", "Soft": rlimit_cpu_s(s), "Hard": rlimit_cpu_s(s)},
    ]
    if s.pids_limit_mode == "rlimit":
        ulimits.append({"Name": "nproc", "Soft": shape.pids + 1, "Hard": shape.pids + 1})
        pids_limit = s.host_pids_limit
    else:
        pids_limit = shape.pids + 1  # + the launcher
    uid, gid = s.user.split(":")
    disk = f"size={shape.disk_mb}m,nr_inodes={max(1024, shape.disk_mb * 256)}"
    security = ["no-new-privileges"]
    if seccomp_json:  # the profile file's content, read at start-up
        security.append("seccomp=" + seccomp_json)
    host_config: dict[str, Any] = {
        "NetworkMode": "none",
        "ReadonlyRootfs": True,
        "CapDrop": ["ALL"],
        "SecurityOpt": security,
        "Privileged": False,
        "Init": False,  # the launcher is PID 1 and reaps; containers are killed, not stopped
        "AutoRemove": False,  # the exit status and OOMKilled are read before removal
        "Memory": memory,
        "MemorySwap": memory,  # no swap
        "NanoCpus": int(shape.cpus * 1e9),
        "PidsLimit": pids_limit,
        "Ulimits": ulimits,
        "ShmSize": shape.disk_mb * MIB,
        "IpcMode": "private",
        "Tmpfs": {
            "/workspace": f"{disk},mode=0700,uid={uid},gid={gid}",
            "/tmp": f"{disk},mode=1777",
            "/code": f"size={s.code_tmpfs_mb}m,nr_inodes=64,mode=0755,uid={uid},gid={gid}",
        },
        "MaskedPaths": MASKED_PATHS,
        "Mounts": etc_mounts(etc_dir) if etc_dir else [],
        "Runtime": s.runtime,
        "LogConfig": {"Type": "none", "Config": {}},
    }
    return {
        "Image": image,
        "Cmd": [s.launcher_python, "-I", "-S", *launcher],
        "User": s.user,
        # The program's environment is the one the launcher gives it (never this):
        # what to start ahead rides in the launcher's own, which no other process of
        # the container can read (it is not dumpable), unlike its command line.
        "Env": [f"{key}={value}" for key, value in s.env.items()]
        + ([f"{AHEAD_VARIABLE}={json.dumps(ahead, separators=(',', ':'))}"] if ahead else []),
        "WorkingDir": "/workspace",
        "Hostname": "sandbox",
        "Labels": labels,
        "Tty": False,
        "OpenStdin": True,
        # When the gateway's attach connection drops, the launcher reads EOF: a
        # container made ahead exits by itself if its gateway dies.
        "StdinOnce": True,
        "AttachStdin": True,
        "AttachStdout": True,
        "AttachStderr": True,
        "NetworkDisabled": True,
        "HostConfig": host_config,
    }


def etc_mounts(etc_dir: str) -> list[dict[str, Any]]:
    """The generated files over the engine's: a mount of the user's own at these
    paths makes the engine leave its copies (and their host paths) out."""
    return [
        {"Type": "bind", "Source": f"{etc_dir}/{name}", "Target": f"/etc/{name}",
         "ReadOnly": True, "BindOptions": {"Propagation": "rprivate"}}
        for name in ETC_FILES
    ]  # fmt: skip


# Interpreters that read their program from a pipe one byte per system call.
UNBUFFERED_READERS = frozenset({"bash", "sh", "dash"})


def reads_unbuffered(settings: DockerSettings, language: str) -> bool:
    return Path(settings.runtimes[language].argv[0]).name in UNBUFFERED_READERS


# Interpreters that read their whole program, and compile it, before running any of
# it: an interpreter started ahead may be given its program before the file is in
# place, since the pipe's end, which it waits for, comes after that.
WHOLE_READERS = re.compile(r"python3?(\.\d+)?|node(js)?")


def reads_whole(settings: DockerSettings, language: str) -> bool:
    return WHOLE_READERS.fullmatch(Path(settings.runtimes[language].argv[0]).name) is not None


def program_env(settings: DockerSettings, proxy: bool) -> dict[str, str]:
    """The program's whole environment: the configured one, and with a network
    boundary the proxy's address (the same whether or not this execution may use
    it, so an interpreter started ahead has it from its start)."""
    if not proxy:
        return dict(settings.env)
    return {**settings.env, **dict(v.split("=", 1) for v in PROXY_ENV)}


def ahead_program(
    settings: DockerSettings, language: str, proxy: bool, relay: list[Any] | None
) -> dict[str, Any]:
    """What the launcher of a container made ahead starts before any request: the
    interpreter of `language` on its code file, with the program's environment
    (nothing of a request, nothing secret: the engine shows it to whoever inspects
    the container)."""
    runtime = settings.runtimes[language]
    ahead: dict[str, Any] = {
        "argv": runtime.argv,
        "filename": runtime.filename,
        "env": program_env(settings, proxy),
    }
    if relay:
        ahead["proxy_relay"] = relay
    return ahead


def launch_request(
    settings: DockerSettings,
    spec: ExecSpec,
    code: bytes,
    nonce: str,
    *,
    proxy: bool = False,
    pipe_bytes: int = 0,
    fresh: bool = False,
) -> dict[str, Any]:
    """The header the launcher reads: everything about this execution but its bytes
    (`pipe_bytes`: what the host sends for an interpreter started ahead to read
    instead of the code's own bytes, after them; 0: the code itself; `fresh`: the
    interpreter started ahead is to be replaced by one started on the file)."""
    runtime = settings.runtimes[spec.language]
    return {
        "nonce": nonce,
        "argv": runtime.argv,
        "filename": runtime.filename,
        "env": program_env(settings, proxy),
        "pipe_bytes": pipe_bytes,
        "fresh": fresh,
        "whole": reads_whole(settings, spec.language),
        "code_bytes": len(code),
        "files": [[f.path, len(f.content)] for f in spec.files],
        "stdin_bytes": len(spec.stdin),
        "backstop_s": spec.limits.timeout_s + settings.backstop_margin_s,
        "max_files": settings.max_output_files,
        "max_file_bytes": settings.max_output_file_bytes,
        "max_total_bytes": settings.max_output_total_bytes,
    }
