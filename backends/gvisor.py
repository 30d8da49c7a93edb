"""The docker-gvisor backend: the docker backend with gVisor's runsc as the runtime.

Programs run on gVisor's own kernel (the Sentry), in user space, so a kernel bug
reachable through a system call is gVisor's, not the host's: the second kernel
boundary for tenants who need one. It costs start-up time and some system call
speed. The engine must know runsc as a runtime with `--network=none` in its runtime
args (deploy/docker/start-dockerd.sh); at start-up this backend proves that its
sandboxes really run on gVisor, and refuses to start otherwise.
"""

from __future__ import annotations

from typing import Any

from backends.base import BackendError
from backends.docker import DockerBackend
from backends.docker_settings import GvisorSettings


class GvisorBackend(DockerBackend):
    name = "docker-gvisor"
    Settings = GvisorSettings

    async def verify_runtime(self, probe: dict[str, Any], state: dict[str, Any]) -> None:
        """Three independent signs, all required: the engine says the probe's container
        ran with runsc; the kernel the probe saw is not the engine host's; and its
        kernel log is gVisor's (which shows it to any user, where Linux refuses)."""
        runtime = state.get("Runtime")
        if runtime != self.settings.runtime:
            raise BackendError(f"gVisor not in use: the probe ran with runtime {runtime!r}")
        host_kernel = (await self.engine.info()).get("KernelVersion")
        if probe.get("release") == host_kernel:
            raise BackendError(
                f"gVisor not in use: the probe saw the host's kernel {host_kernel!r}"
            )
        if "gVisor" not in probe.get("kernel_log", ""):
            raise BackendError("gVisor not in use: the probe's kernel log is not gVisor's")
