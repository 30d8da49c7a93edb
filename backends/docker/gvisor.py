"""The docker-gvisor backend: the docker backend with gVisor's runsc as the runtime.

Programs run on gVisor's own kernel (the Sentry), in user space, so a kernel bug
reachable through a system call is gVisor's, not the host's: the second kernel
boundary for tenants who need one. It costs start-up time and some system call
speed. The engine must know runsc as a runtime with `--network=none` in its runtime
args, and as `runsc-egress` for sandboxes with controlled egress
(deploy/docker/start-dockerd.sh); at start-up this backend proves that its
sandboxes really run on gVisor, and refuses to start otherwise.
"""

from __future__ import annotations

import json
from typing import Any

from backends.base import BackendError
from backends.docker.backend import DockerBackend
from backends.docker.seccomp import bundled_profile
from backends.docker.settings import GvisorSettings
from backends.egress.addresses import NameResolver


class GvisorBackend(DockerBackend):
    name = "docker-gvisor"
    Settings = GvisorSettings
    # runsc's netstack sees no socket the gateway puts in a container's namespace:
    # each sandbox joins a runc holder's namespace, linked to the gateway's sinkhole
    # (backends/egress/veth.py), under a runtime whose netstack takes that link.
    # Without that runtime (egress_runtime = ""): no network at all, no egress.
    network_boundary = True
    # gVisor runs its own kernel: the host's tracer would see only the Sentry.
    host_capture = False

    def __init__(
        self, settings: GvisorSettings | None = None, *, egress_resolver: NameResolver | None = None
    ) -> None:
        super().__init__(settings, egress_resolver=egress_resolver)
        self.network_boundary = bool(self.holder_runtime())

    def holder_runtime(self) -> str:
        return str(getattr(self.settings, "egress_runtime", ""))

    def _seccomp_json(self) -> str:
        """The bundled allowlist with clone3 allowed: runsc (with --oci-seccomp) drops
        a rule's errnoRet (google/gvisor#14688), so clone3 would fail with EPERM, glibc
        would not fall back to clone(2) and no program could start a thread. clone3's
        flags cannot be filtered; the namespaces it makes are gVisor's own."""
        if self.settings.seccomp_profile != "bundled":
            return super()._seccomp_json()
        profile = bundled_profile()
        for rule in profile["syscalls"]:
            if rule["names"] == ["clone3"]:
                rule["action"] = "SCMP_ACT_ALLOW"
                rule.pop("errnoRet", None)
        return json.dumps(profile, separators=(",", ":"))

    async def verify_runtime(self, probe: dict[str, Any], state: dict[str, Any]) -> None:
        """Three independent signs, all required: the engine says the probe's container
        ran with runsc; the kernel the probe saw is not the engine host's; and its
        kernel log is gVisor's or its root file system is served by gVisor's gofer."""
        runtime = state.get("Runtime")
        if runtime not in (self.settings.runtime, self.settings.egress_runtime):
            raise BackendError(f"gVisor not in use: the probe ran with runtime {runtime!r}")
        host_kernel = (await self.engine.info()).get("KernelVersion")
        if probe.get("release") == host_kernel:
            raise BackendError(
                f"gVisor not in use: the probe saw the host's kernel {host_kernel!r}"
            )
        # The seccomp profile denies syslog(2), so gVisor's kernel log is rarely
        # readable; its gofer serving the root over 9p is the sign that remains.
        root_fs = probe.get("root_fs", "")
        if "gVisor" not in probe.get("kernel_log", "") and not root_fs.startswith("9p "):
            raise BackendError(f"gVisor not in use: the probe's root is {root_fs!r}")
