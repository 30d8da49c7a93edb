"""Deliberately weakened backends, reachable only from tests: proof that the
probes can go red. Each keeps every production code path and changes only what
the sandbox is made with (nsjail's argv, the container create request).

Never toward a non-loopback network: the host network namespace only ever
carries the suite's traffic to 127.0.0.1 and ::1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from backends.base import ExecResult, ExecSpec
from backends.docker import DockerBackend
from backends.docker_engine import Engine
from backends.gvisor import GvisorBackend
from backends.nsjail import NsjailBackend
from backends.nsjail_config import INSIDE_ID
from backends.nsjail_sandbox import Sandbox, SandboxFactory


class WeakFactory(SandboxFactory):
    """Host network and user namespaces, capabilities kept, no seccomp, the
    canaries bound in. (Root mapped to host root is no option here: the
    workspace belongs to the sandbox uid, which such a namespace cannot map.)"""

    canary_dir: Path

    def argv(self, sandbox: Sandbox) -> list[str]:
        args = super().argv(sandbox)
        # Not into the gateway's boundary namespace: nsjail stays in the host's.
        at = args.index(self.nsenter)
        del args[at : at + 3]
        at = args.index("--seccomp_policy")
        del args[at : at + 2]
        s = self.settings
        args[args.index(f"{INSIDE_ID}:{s.sandbox_uid}:1")] = str(s.sandbox_uid)
        args[args.index(f"{INSIDE_ID}:{s.sandbox_gid}:1")] = str(s.sandbox_gid)
        at = len(args) - 1 - args[::-1].index("--")  # nsjail's own, not the shim's
        extra = ["--disable_clone_newnet", "--disable_clone_newuser", "--keep_caps",
                 "--bindmount_ro", str(self.canary_dir)]  # fmt: skip
        return [*args[:at], *extra, *args[at:]]


class WeakNsjail(NsjailBackend):
    def __init__(self, settings: Any, canary_dir: Path) -> None:
        super().__init__(settings)
        self.canary_dir = canary_dir
        self.runs_seen = 0

    async def run(self, spec: ExecSpec) -> ExecResult:
        self.runs_seen += 1
        return await super().run(spec)

    def _start_sync(self) -> None:
        super()._start_sync()
        f = self._require_factory()
        weak = WeakFactory(f.settings, f.binary, f.etc_dir, f.policy_path, f.workspaces, f.cgroups)
        weak.canary_dir = self.canary_dir
        self._factory = weak


class WeakEngine(Engine):
    """Rewrites create requests once `weak` is set (after the start-up probe,
    which insists on a seccomp filter)."""

    weak = False
    canary_dir = Path()

    async def create(self, body: dict[str, Any], name: str) -> str:
        if self.weak:
            host = body["HostConfig"]
            host["NetworkMode"] = "host"
            host["SecurityOpt"] = ["seccomp=unconfined"]
            host["Binds"] = [f"{self.canary_dir}:{self.canary_dir}:ro"]
            body["NetworkDisabled"] = False
            body.pop("Hostname", None)
            # Root needs its capabilities back to use the sandbox user's tmpfs mounts.
            body["User"] = "0:0"
            host["CapDrop"], host["CapAdd"] = [], ["DAC_OVERRIDE", "FOWNER", "SYS_ADMIN", "NET_RAW"]
        return await super().create(body, name)


def weaken(backend: DockerBackend, canary_dir: Path) -> DockerBackend:
    s = backend.settings
    engine = WeakEngine(s.docker_host, s.engine_threads, s.engine_timeout_s)
    engine.canary_dir = canary_dir
    backend.engine = engine
    # On the host network there is no sandbox namespace to furnish (boundary.py refuses).
    backend.network_boundary = False
    return backend


__all__ = ["GvisorBackend", "WeakNsjail", "weaken"]
