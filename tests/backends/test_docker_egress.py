"""Egress on docker (runc): the conformance suite on one backend per module."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from backends.docker import DockerBackend
from backends.docker_settings import DockerSettings
from tests.backends.conftest import assert_docker_host_clean, start_docker_backend
from tests.backends.egress_conformance import ModuleLoopEgressConformance, conformance_resolver

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def backend() -> AsyncIterator[DockerBackend]:
    backend = await start_docker_backend(
        DockerBackend(DockerSettings(), egress_resolver=conformance_resolver())
    )
    try:
        yield backend
    finally:
        await backend.close()


class TestDockerEgress(ModuleLoopEgressConformance):
    pass


async def test_nothing_left_in_the_engine(backend: DockerBackend) -> None:
    await assert_docker_host_clean(backend)
