"""The app's own wiring that no request shows: the backends share one host tracer;
a served gateway's start-up heap is frozen."""

from __future__ import annotations

import gc
from pathlib import Path

from aiohttp import web

from backends.capture.host import TracerHub
from backends.docker.backend import DockerBackend
from backends.nsjail.backend import NsjailBackend
from gateway.app import freeze_startup_heap, make_backends
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


async def test_the_startup_heap_is_kept_out_of_full_collections() -> None:
    # `execgate serve` runs it after start-up (a real serve: tests/gateway/test_shutdown.py).
    gc.unfreeze()
    kept = [[] for _ in range(10)]  # tracked by the collector, unlike a bare object()
    try:
        await freeze_startup_heap(web.Application())
        assert gc.get_freeze_count() >= len(kept)
        # In no generation the collector walks.
        assert not any(o is kept[0] for o in gc.get_objects())
    finally:
        gc.unfreeze()
