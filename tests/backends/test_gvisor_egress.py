"""Egress on docker-gvisor (runsc-egress in a holder's namespace linked to the
gateway's sinkhole): the conformance suite on one backend per module."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from backends.docker_settings import GvisorSettings
from backends.gvisor import GvisorBackend
from tests.backends.conftest import assert_docker_host_clean, start_docker_backend
from tests.backends.egress_conformance import ModuleLoopEgressConformance, conformance_resolver

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def backend() -> AsyncIterator[GvisorBackend]:
    backend = await start_docker_backend(
        GvisorBackend(GvisorSettings(), egress_resolver=conformance_resolver())
    )
    try:
        yield backend
    finally:
        await backend.close()


class TestGvisorEgress(ModuleLoopEgressConformance):
    pass


async def test_nothing_left_in_the_engine(backend: GvisorBackend) -> None:
    await assert_docker_host_clean(backend)
