"""Egress on docker-gvisor (runsc-egress in a holder's namespace linked to the
gateway's sinkhole): the conformance suite on one backend per module."""

from __future__ import annotations

import pytest

from backends.docker.gvisor import GvisorBackend
from backends.docker.settings import GvisorSettings
from tests.backends.conftest import assert_docker_host_clean, module_docker_backend
from tests.backends.egress_conformance import ModuleLoopEgressConformance, conformance_resolver

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


backend = module_docker_backend(
    lambda tracers: GvisorBackend(
        GvisorSettings(), egress_resolver=conformance_resolver(), tracers=tracers
    )
)


class TestGvisorEgress(ModuleLoopEgressConformance):
    pass


async def test_nothing_left_in_the_engine(backend: GvisorBackend) -> None:
    await assert_docker_host_clean(backend)
