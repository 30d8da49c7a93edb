"""Egress on nsjail: the conformance suite, and nothing left on the host."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator

import pytest

from backends.egress.boundary import TUN_NAME
from backends.nsjail.backend import NsjailBackend
from backends.nsjail.settings import NsjailSettings
from tests.backends.egress_conformance import (
    EgressConformance,
    conformance_resolver,
    run_python,
)

pytestmark = pytest.mark.integration  # drives a real nsjail


@pytest.fixture
async def backend(nsjail_settings: NsjailSettings) -> AsyncIterator[NsjailBackend]:
    backend = NsjailBackend(nsjail_settings, egress_resolver=conformance_resolver())
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()


class TestNsjailEgress(EgressConformance):
    pass


def host_network_state() -> tuple[str, str]:
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    return netns, links


async def test_no_namespace_or_device_left_on_the_host(nsjail_backend: NsjailBackend) -> None:
    before = host_network_state()
    await run_python(nsjail_backend, "import socket\nsocket.socket().connect_ex(('192.0.2.1', 1))")
    await nsjail_backend.close()
    assert host_network_state() == before
    assert TUN_NAME not in before[1]
