"""Settings of the docker backends: the `[backends.docker]` and `[backends.docker-gvisor]` tables.

Every default is the safe one: no network, a read-only image run as an unprivileged
user without capabilities, the bundled seccomp allowlist, tmpfs workspaces, explicit
environment only. The two backends differ only in their runtime and in how the
process count is capped (see `pids_limit_mode`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from backends.ceilings import SandboxCeilings
from backends.runtimes import RuntimeSettings, default_runtimes

# Container variables that are not the operator's to set: the launcher's
# (config.AHEAD_VARIABLE) and the egress runtime's (sandbox.EGRESS_NETNS_VARIABLE).
RESERVED_ENV = frozenset({"EXECGATE_AHEAD", "EXECGATE_NETNS"})


class DockerSettings(SandboxCeilings):
    model_config = ConfigDict(extra="forbid")

    # The engine's API: explicit, never taken from DOCKER_* variables of the gateway.
    docker_host: str = "unix:///var/run/docker.sock"
    # Empty: the image `make images` builds from the bundled recipe, tagged by its hash.
    # Any other image needs a python3 (for the launcher) and the runtimes' paths.
    image: str = ""
    runtime: str = "runc"
    # The launcher (backends/docker/launcher.py) runs with this interpreter as PID 1.
    launcher_python: str = "/usr/bin/python3"
    # "uid:gid" the container runs as: unprivileged, owning nothing on the host.
    user: str = Field("150000:150000", pattern=r"^[1-9][0-9]{3,9}:[1-9][0-9]{3,9}$")
    # "bundled": the allowlist all backends share (backends/seccomp.kafel, see
    # seccomp.py); "engine": the engine's default profile; else a JSON file.
    seccomp_profile: str = "bundled"
    runtimes: dict[str, RuntimeSettings] = Field(default_factory=default_runtimes)
    env: dict[str, str] = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/workspace",
                           "LANG": "C.UTF-8"}  # fmt: skip

    # "cgroup": the engine's pids limit (runc: it counts the program's processes).
    # "rlimit": RLIMIT_NPROC inside the sandbox (gVisor: its kernel counts them per
    # sandbox, while the host cgroup sees only its own threads), with
    # `host_pids_limit` as the host cgroup's backstop.
    pids_limit_mode: Literal["cgroup", "rlimit"] = "cgroup"
    host_pids_limit: int = Field(1024, ge=64, le=65536)
    # On top of the request's memory: the launcher (and gVisor's kernel) live in the
    # same memory cgroup as the program.
    memory_overhead_mb: int = Field(16, ge=0, le=4096)
    # /code holds the program file; the gateway caps request bodies well below this.
    code_tmpfs_mb: int = Field(16, ge=1, le=1024)
    rlimit_nofile: int = Field(256, ge=16, le=65536)
    # Seconds the launcher's own deadline trails ours (a backstop if the gateway dies).
    backstop_margin_s: int = Field(2, ge=1, le=60)

    # Containers started ahead of requests, each used once: at least this many
    # (0: no pool, every container started on demand), and as many more as recent
    # demand needs (arrivals per second over `pool_demand_window_s` times the measured
    # start latency), up to `pool_max_size`; back to the floor when demand falls.
    pool_size: int = Field(2, ge=0, le=64)
    pool_max_size: int = Field(8, ge=0, le=64)
    pool_demand_window_s: float = Field(10.0, gt=0, le=3600)
    # Containers started ahead at once (more only slow each other down).
    pool_fill_concurrency: int = Field(2, ge=1, le=32)
    # Used containers removed at once, off the request path (the rest queue, and
    # are all removed before the backend settles or closes).
    remove_concurrency: int = Field(2, ge=1, le=64)
    # A waiting container older than this is thrown away rather than used.
    pool_max_age_s: int = Field(300, ge=1, le=86400)
    # Containers of dead gateway instances are removed at start and this often.
    reap_interval_s: float = Field(60.0, gt=0)
    # Engine API calls (create, start, remove...) run on this many threads.
    engine_threads: int = Field(16, ge=2, le=256)
    engine_timeout_s: float = Field(30.0, gt=0)
    # How long a container may take from create to its launcher saying it is ready.
    start_timeout_s: float = Field(30.0, gt=0)
    # Each container made ahead starts its language's interpreter on the code file's
    # path (a FIFO until the code is handed over): the request finds its start-up
    # done. The pool is then split by language too. False: the launcher starts the
    # interpreter once the code is there.
    start_interpreter_ahead: bool = True
    # bash reads a script from a pipe one byte per system call (it cannot seek back
    # there): code longer than this is run by a bash started once it is in place
    # (the one started ahead is killed); 0: bash is not started ahead.
    ahead_unbuffered_max_bytes: int = Field(16384, ge=0, le=1 << 20)

    @field_validator("env")
    @classmethod
    def _plain_env(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            if not key or "=" in key or "\x00" in key + item:
                raise ValueError(f"environment variable {key!r} is not a plain NAME=value")
            if key in RESERVED_ENV:
                raise ValueError(f"environment variable {key!r} is execgate's own")
        return value


class GvisorSettings(DockerSettings):
    runtime: str = "runsc"
    # runsc with its own netstack on the links of a namespace the gateway makes
    # (controlled egress: backends/egress/veth.py, deploy/docker/runsc-netns);
    # registered by deploy/docker/start-dockerd.sh.
    # "": runsc --network=none only (loopback, no egress, nothing recorded).
    egress_runtime: str = "runsc-egress"
    # Behaviour capture ([backends.docker-gvisor.capture]): the same two runtimes with
    # gVisor's strace into a log per container under `trace_dir` (deploy/docker/
    # runsc-capture, registered by start-dockerd.sh; its EXECGATE_GVISOR_TRACE_DIR).
    capture_runtime: str = "runsc-capture"
    capture_egress_runtime: str = "runsc-egress-capture"
    trace_dir: str = "/run/execgate-gvisor-trace"
    pids_limit_mode: Literal["cgroup", "rlimit"] = "rlimit"
    # A system call costs tens of microseconds on gVisor's ptrace platform: bash
    # reading its script byte by byte from a pipe loses more than its start saves.
    ahead_unbuffered_max_bytes: int = Field(0, ge=0, le=1 << 20)
    # gVisor's kernel (the Sentry) and its file proxy share the container's cgroup.
    memory_overhead_mb: int = Field(64, ge=0, le=4096)
