"""Deliberately weakened backends, reachable only from tests: proof that the
probes can go red. Each keeps every production code path and changes only what
the sandbox is made with (nsjail's argv, the container create request).

Never toward a non-loopback network: the host network namespace only ever
carries the suite's traffic to 127.0.0.1 and ::1."""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

from backends.base import ExecResult, ExecSpec, OutputFile
from backends.docker.backend import DockerBackend
from backends.docker.engine import Engine
from backends.docker.gvisor import GvisorBackend
from backends.nsjail.backend import NsjailBackend
from backends.nsjail.config import INSIDE_ID
from backends.nsjail.sandbox import Sandbox, SandboxFactory
from backends.workspace import Collected, Workspace, WorkspaceManager

# What the weakened nsjail grants instead of the request's limits: bounded (the
# probes stop themselves: 4000 threads, 256 MiB, 128 MiB of disk), never unlimited
# on a shared machine.
LOOSE = {"memory_mb": 1024, "pids": 256, "disk_mb": 256}


def credential_canary(canary_dir: Path) -> Path:
    """A signing key of the gateway's, as far as the suite knows (credential_files),
    in a directory the weakened sandboxes bind in."""
    secrets_dir = canary_dir.parent / "secrets"
    secrets_dir.mkdir(mode=0o755, exist_ok=True)
    key = secrets_dir / "hs256.key"
    key.write_bytes(os.urandom(32).hex().encode())
    key.chmod(0o644)
    return key


class WeakWorkspaces(WorkspaceManager):
    """Collects output the naive way: following links, so a link to a host file
    hands back the host file (what `collect` refuses with O_NOFOLLOW)."""

    def collect(
        self, ws: Workspace, max_files: int, max_file_bytes: int, max_total_bytes: int
    ) -> Collected:
        files = []
        for entry in sorted(os.scandir(ws.workspace_dir), key=lambda e: e.name):
            try:
                if not stat.S_ISREG(os.stat(entry.path).st_mode):  # follows the link
                    continue
                with open(entry.path, "rb") as f:
                    content = f.read(max_file_bytes)
            except OSError:
                continue
            files.append(OutputFile(entry.name, len(content), content))
        return Collected(files=tuple(files[:max_files]), skipped=())


class WeakFactory(SandboxFactory):
    """Host network, pid and user namespaces, capabilities kept, no seccomp, the
    canaries bound in, one /tmp shared by every sandbox, loose limits. (Root mapped
    to host root is no option here: the workspace belongs to the sandbox uid, which
    such a namespace cannot map.)"""

    canary_dir: Path
    shared_tmp: Path
    host_pid = False

    def configure(self, sandbox: Sandbox, spec: ExecSpec) -> None:
        super().configure(sandbox, replace(spec, limits=replace(spec.limits, **LOOSE)))

    def network_namespace(self, sandbox: Sandbox) -> int | None:
        return None  # not the gateway's boundary: nsjail starts in the host's

    def argv(self, sandbox: Sandbox) -> list[str]:
        args = super().argv(sandbox)
        args[args.index(f"{sandbox.workspace.tmp_dir}:/tmp")] = f"{self.shared_tmp}:/tmp"
        at = args.index("--seccomp_policy")
        del args[at : at + 2]
        s = self.settings
        args[args.index(f"{INSIDE_ID}:{s.sandbox_uid}:1")] = str(s.sandbox_uid)
        args[args.index(f"{INSIDE_ID}:{s.sandbox_gid}:1")] = str(s.sandbox_gid)
        at = len(args) - 1 - args[::-1].index("--")  # nsjail's own, not the shim's
        extra = ["--disable_clone_newnet", "--disable_clone_newuser", "--keep_caps",
                 "--bindmount_ro", str(self.canary_dir),
                 "--bindmount_ro", str(self.canary_dir.parent / "secrets")]  # fmt: skip
        if self.host_pid:
            # The host's processes in reach (its orphans outlive nsjail's tree:
            # the runs that leave daemons fail, so only neighbours tests use it).
            extra.append("--disable_clone_newpid")
        return [*args[:at], *extra, *args[at:]]


class WeakNsjail(NsjailBackend):
    def __init__(self, settings: Any, canary_dir: Path, host_pid: bool = False) -> None:
        super().__init__(settings)
        self.host_pid = host_pid
        w = self.workspaces
        self.workspaces = WeakWorkspaces(w.runs_dir, w.uid, w.gid, w.inodes_per_mb)
        self.canary_dir = canary_dir
        self.runs_seen = 0
        self.shared_tmp = self.state_dir / "shared-tmp"
        self.credentials = (str(credential_canary(canary_dir)),)

    async def run(self, spec: ExecSpec) -> ExecResult:
        self.runs_seen += 1
        return await super().run(spec)

    def _start_sync(self) -> None:
        super()._start_sync()
        f = self._require_factory()
        weak = WeakFactory(f.settings, f.binary, f.etc_dir, f.policy_path, f.workspaces, f.cgroups)
        weak.canary_dir = self.canary_dir
        self.shared_tmp.mkdir(mode=0o1777, exist_ok=True)
        self.shared_tmp.chmod(0o1777)
        weak.shared_tmp = self.shared_tmp
        weak.host_pid = self.host_pid
        self._factory = weak


class WeakEngine(Engine):
    """Rewrites create requests once `weak` is set (after the start-up probe,
    which insists on a seccomp filter)."""

    weak = False
    canary_dir = Path()
    credentials: tuple[str, ...] = ()

    async def create(self, body: dict[str, Any], name: str) -> str:
        if self.weak:
            host = body["HostConfig"]
            host["NetworkMode"] = "host"
            host["SecurityOpt"] = ["seccomp=unconfined"]
            secrets_dir = self.canary_dir.parent / "secrets"
            host["Binds"] = [f"{self.canary_dir}:{self.canary_dir}:ro",
                             f"{secrets_dir}:{secrets_dir}:ro"]  # fmt: skip
            body["NetworkDisabled"] = False
            body.pop("Hostname", None)
            # Root needs its capabilities back to use the sandbox user's tmpfs mounts;
            # SYSLOG opens the host's kernel log and kallsyms addresses.
            body["User"] = "0:0"
            host["CapDrop"] = []
            host["CapAdd"] = ["DAC_OVERRIDE", "FOWNER", "SYS_ADMIN", "NET_RAW", "SYSLOG"]
        return await super().create(body, name)


def weaken(backend: DockerBackend, canary_dir: Path) -> DockerBackend:
    s = backend.settings
    engine = WeakEngine(s.docker_host, s.engine_threads, s.engine_timeout_s)
    engine.canary_dir = canary_dir
    engine.credentials = (str(credential_canary(canary_dir)),)
    backend.engine = engine
    # On the host network there is no sandbox namespace to furnish (boundary.py refuses).
    backend.network_boundary = False
    return backend


__all__ = ["GvisorBackend", "WeakNsjail", "weaken"]
