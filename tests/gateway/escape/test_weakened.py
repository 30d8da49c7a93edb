"""Proof that the probes can fail: weakened sandboxes must be reported escaped.

Each backend is weakened where that is feasible (tests/gateway/escape/weakened.py):
nsjail and docker get the host network namespace, no seccomp filter, root mapped
to host root and the canary directory bound in; gVisor the same but its network
(runsc is registered with --network=none, so its loopback is never the host's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.docker import DockerBackend
from backends.docker_settings import DockerSettings, GvisorSettings
from backends.gvisor import GvisorBackend
from backends.nsjail_settings import NsjailSettings
from gateway.escape.catalog import techniques
from gateway.escape.report import row
from gateway.escape.runner import run_suite
from gateway.escape.technique import Outcome
from tests.backends.conftest import start_docker_backend
from tests.gateway.escape.weakened import WeakEngine, WeakNsjail, weaken

pytestmark = pytest.mark.integration

NETWORK = ["network.tcp_ipv4", "network.tcp_ipv6", "network.udp_ipv4", "network.udp_ipv6",
           "network.interfaces", "neighbours.abstract_socket"]  # fmt: skip
COMMON = ["host_files.absolute", "posture.seccomp", "posture.uid_map", "posture.capabilities",
          "privilege.unshare"]  # fmt: skip


async def assert_escaped(backend: object, ids: list[str], canary_dir: Path) -> None:
    chosen = [t for t in techniques() if t.id in ids]
    result = await run_suite(backend, chosen, canary_dir=canary_dir)  # type: ignore[arg-type]
    outcomes = {f.technique.id: f.verdict.outcome for f in result.findings}
    assert outcomes == dict.fromkeys(ids, Outcome.ESCAPED), "\n".join(
        row(f) for f in result.findings
    )


async def test_weakened_nsjail_goes_red(
    escape_nsjail_settings: NsjailSettings, canary_dir: Path
) -> None:
    settings = escape_nsjail_settings.model_copy(update={"warm_pool_size": 0})
    backend = WeakNsjail(settings, canary_dir)
    await backend.start()
    try:
        ids = ["host_files.absolute", "posture.seccomp", "posture.capabilities",
               "privilege.unshare", "posture.namespaces", *NETWORK]  # fmt: skip
        await assert_escaped(backend, ids, canary_dir)
    finally:
        await backend.close()


@pytest.mark.parametrize(
    "backend_class, settings, ids",
    [
        (DockerBackend, DockerSettings(pool_size=0), [*COMMON, *NETWORK, "posture.namespaces"]),
        (GvisorBackend, GvisorSettings(pool_size=0), COMMON),
    ],
    ids=["docker", "docker-gvisor"],
)
async def test_weakened_docker_backends_go_red(
    backend_class: type[DockerBackend],
    settings: DockerSettings,
    ids: list[str],
    canary_dir: Path,
) -> None:
    backend = weaken(backend_class(settings), canary_dir)
    await start_docker_backend(backend)
    try:
        assert isinstance(backend.engine, WeakEngine)
        backend.engine.weak = True  # after the start-up probe, which insists on seccomp
        await assert_escaped(backend, ids, canary_dir)
    finally:
        await backend.close()
