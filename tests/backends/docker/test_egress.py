"""Egress on docker (runc): the conformance suite on one backend per module."""

from __future__ import annotations

import pytest

from backends.docker.backend import DockerBackend
from backends.docker.settings import DockerSettings
from tests.backends.conftest import assert_docker_host_clean, module_docker_backend
from tests.backends.egress_conformance import ModuleLoopEgressConformance, conformance_resolver

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


backend = module_docker_backend(
    lambda tracers: DockerBackend(
        DockerSettings(), egress_resolver=conformance_resolver(), tracers=tracers
    )
)


class TestDockerEgress(ModuleLoopEgressConformance):
    pass


async def test_nothing_left_in_the_engine(backend: DockerBackend) -> None:
    await assert_docker_host_clean(backend)
