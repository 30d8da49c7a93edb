"""Retry where nothing ran, on both docker backends (runc and gVisor), for real.

Start failures are injected at the engine boundary (an Engine whose `start` refuses
a given number of times) or provoked (a container made ahead killed from outside
before it is used). A container that fails before the program is handed over is
replaced by a fresh one, each failure a `start_failed` event and a count; once the
program has been handed over nothing is retried; nothing is left in the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from backends.base import BackendError, ExecSpec, Limits, SandboxStartError, Status
from backends.capture.host import TracerHub
from backends.docker.backend import DockerBackend
from backends.docker.engine import Engine
from backends.docker.gvisor import GvisorBackend
from backends.docker.sandbox import Container
from backends.docker.settings import DockerSettings, GvisorSettings
from tests.backends.conformance import run
from tests.backends.conftest import (
    NO_CAPTURE,
    assert_docker_host_clean,
    start_docker_backend,
    until,
)

pytestmark = pytest.mark.integration

BACKENDS = {
    "docker": (DockerBackend, DockerSettings),
    "docker-gvisor": (GvisorBackend, GvisorSettings),
}


class FlakyEngine(Engine):
    """The real engine, but `start` refuses `refuse` times once armed (as the engine
    refused gVisor starts: `cannot start a stopped process`)."""

    refuse = 0
    starts = 0

    async def start(self, container: str) -> None:
        self.starts += 1
        if self.refuse:
            self.refuse -= 1
            raise BackendError("docker engine (start): injected: cannot start a stopped process")
        await super().start(container)


def flaky(cls: type[DockerBackend]) -> type[DockerBackend]:
    class Flaky(cls):  # type: ignore[valid-type, misc]
        def __init__(self, settings: DockerSettings, tracers: TracerHub | None = None) -> None:
            super().__init__(settings, tracers=tracers)
            s = self.settings
            self.engine = FlakyEngine(s.docker_host, s.engine_threads, s.engine_timeout_s)

    return Flaky


@contextlib.asynccontextmanager
async def started(
    name: str, tracers: TracerHub, **settings: object
) -> AsyncIterator[DockerBackend]:
    """The backend with capture on, on the run's shared host tracer (a tracer of its
    own would attach and detach ~290 tracepoints: half a minute per test)."""
    cls, settings_cls = BACKENDS[name]
    backend = await start_docker_backend(flaky(cls)(settings_cls(**settings), tracers=tracers))
    try:
        yield backend
    finally:
        await backend.close()


def engine_of(backend: DockerBackend) -> FlakyEngine:
    assert isinstance(backend.engine, FlakyEngine)
    return backend.engine


@pytest.mark.parametrize("name", BACKENDS)
async def test_a_refused_start_is_retried_on_a_fresh_container(
    name: str, tracer_hub: TracerHub
) -> None:
    async with started(name, tracer_hub, pool_size=0) as backend:
        engine = engine_of(backend)
        engine.refuse = 2
        result = await run(backend, "python", "print('third time')")
        assert result.status == Status.OK, result.stderr
        assert result.stdout == b"third time\n"
        failed = [e for e in result.events if e.kind == "start_failed"]
        assert len(failed) == 2, result.events
        assert all("injected" in e.detail for e in failed)
        assert sum(backend.start_failures.counts.values()) == 2
        await assert_docker_host_clean(backend)  # the refused ones were removed too


@pytest.mark.parametrize("name", BACKENDS)
async def test_when_every_try_fails_the_error_carries_each_failure(
    name: str, tracer_hub: TracerHub
) -> None:
    async with started(name, tracer_hub, pool_size=0, start_attempts=3) as backend:
        engine_of(backend).refuse = 100
        with pytest.raises(SandboxStartError, match=r"\(3 tries\)") as caught:
            await run(backend, "python", "print('never')")
        assert len(caught.value.events) == 3
        assert backend.start_failures.total == 3
        engine_of(backend).refuse = 0
        await assert_docker_host_clean(backend)


def pooled(backend: DockerBackend) -> Container:
    (container,) = backend.pool._ready
    return container


@pytest.mark.parametrize("name", BACKENDS)
async def test_a_pooled_container_killed_from_outside_is_replaced(
    name: str, tracer_hub: TracerHub
) -> None:
    async with started(name, tracer_hub, pool_size=1) as backend:
        await backend.wait_settled()
        container = pooled(backend)
        factory = backend._require_factory()
        await backend.engine.kill(container.id)
        await until(lambda: factory.dead(container), "the engine to report the kill")
        # The pool's shape (the default limits), so the dead container is the one taken.
        spec = ExecSpec("exe_after_kill", "python", "print('on a fresh one')", Limits())
        result = await backend.run(spec)
        assert result.status == Status.OK, result.stderr
        assert result.stdout == b"on a fresh one\n"
        dead = [e for e in result.events if e.detail.startswith("dead: ")]
        assert len(dead) == 1 and container.name in dead[0].detail, result.events
        assert backend.start_failures.counts["dead"] == 1
        await assert_docker_host_clean(backend)


@pytest.mark.parametrize("name", BACKENDS)
async def test_nothing_is_retried_once_the_program_was_handed_over(
    name: str, tracer_hub: TracerHub
) -> None:
    async with started(name, tracer_hub, pool_size=0) as backend:
        engine = engine_of(backend)
        starts = engine.starts
        task = asyncio.ensure_future(run(backend, "python", "import time\ntime.sleep(60)"))
        # Running means handed over: the request went to the launcher.
        await until(lambda: backend.running_sandboxes, "the execution to start")
        (victim,) = backend._live.values()
        await backend.engine.kill(victim.id)  # the container dies under the program
        result = await task
        assert result.status != Status.OK
        assert not any(e.kind == "start_failed" for e in result.events)
        assert engine.starts - starts == 1
        await assert_docker_host_clean(backend)


async def test_a_refused_probe_start_does_not_stop_start_up() -> None:
    backend = flaky(DockerBackend)(DockerSettings(pool_size=0, capture=NO_CAPTURE))
    engine_of(backend).refuse = 1  # the very first start: the probe's
    seen: list[object] = []
    backend.start_failures.observer = seen.append
    await start_docker_backend(backend)
    try:
        assert backend.start_failures.total == 1 and len(seen) == 1
        assert (await run(backend, "bash", "echo up")).stdout == b"up\n"
        await assert_docker_host_clean(backend)
    finally:
        await backend.close()
