"""The app's own wiring that no request shows: the backends share one host tracer."""

from __future__ import annotations

from pathlib import Path

from backends.capture.host import TracerHub
from backends.docker.backend import DockerBackend
from backends.nsjail.backend import NsjailBackend
from gateway.app import make_backends
from tests.gateway.conftest import make_settings


def test_backends_on_the_host_kernel_share_the_gateways_tracers(tmp_path: Path) -> None:
    # Built, not started: which hub each backend's capture asks is decided here.
    settings = make_settings(
        tmp_path,
        EXECGATE_BACKENDS_DOCKER_POOL_SIZE="0",
        EXECGATE_BACKENDS_NOOP_SLEEP_S="0",
    )
    hub = TracerHub()
    backends = make_backends(settings, hub)
    assert {"nsjail", "docker", "noop"} <= set(backends)
    nsjail, docker = backends["nsjail"], backends["docker"]
    assert isinstance(nsjail, NsjailBackend) and isinstance(docker, DockerBackend)
    assert nsjail.capture.hub is hub and docker.host_trace.hub is hub
