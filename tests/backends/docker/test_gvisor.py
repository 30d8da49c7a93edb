"""The docker-gvisor backend for real: the conformance suite, gVisor's own checks.

Needs a running engine with runsc registered (deploy/docker/start-dockerd.sh) and
the sandbox image (`make images`); CI provides both, elsewhere the tests skip.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from backends.base import BackendError, Status
from backends.capture.settings import CaptureSettings
from backends.docker.gvisor import GvisorBackend
from backends.docker.settings import GvisorSettings
from tests.backends.conformance import (
    EXITING_SLACK,
    FORK_BOMB,
    BackendConformance,
    BehaviourConformance,
    fork_bomb_peak,
    lines,
    run,
)
from tests.backends.conftest import assert_docker_host_clean, module_docker_backend

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]


backend = module_docker_backend(lambda tracers: GvisorBackend(GvisorSettings(), tracers=tracers))


@pytest.fixture
def residue_check(backend: GvisorBackend) -> Callable[[], Awaitable[None]]:
    return lambda: assert_docker_host_clean(backend)


class TestGvisorConformance(BackendConformance):
    pass


class TestGvisorBehaviour(BehaviourConformance):
    pass


async def test_programs_see_gvisors_kernel(backend: GvisorBackend) -> None:
    # The root served by gVisor's gofer over 9p (its kernel log is behind seccomp).
    result = await run(backend, "bash", "uname -r; grep -m1 ' / / ' /proc/self/mountinfo")
    assert result.status == Status.OK, result.stderr
    release, root_mount = lines(result)
    assert release != (await backend.engine.info())["KernelVersion"]
    assert " - 9p " in root_mount
    sealed = await run(backend, "bash", "grep Seccomp: /proc/self/status")
    assert lines(sealed) == ["Seccomp:\t2"]


async def test_fork_bomb(backend: GvisorBackend) -> None:
    result = await run(backend, "bash", FORK_BOMB, timeout_s=3.0, pids=32)
    assert result.status == Status.TIMEOUT
    # The limit held: never more processes than it allows (+ the launcher).
    assert 1 <= fork_bomb_peak(result) <= 32 + 1 + EXITING_SLACK, result.stdout
    await assert_docker_host_clean(backend)


async def test_killing_init_only_ends_the_own_execution(backend: GvisorBackend) -> None:
    # gVisor lets a program signal PID 1 (Linux does not): the execution ends,
    # honestly reported as killed, and nothing is left behind.
    result = await run(backend, "python", "import os\nos.kill(1, 9)")
    assert result.status == Status.KILLED
    await assert_docker_host_clean(backend)


async def test_forged_frames_only_spoil_the_own_result(backend: GvisorBackend) -> None:
    # Under gVisor a program can write into the launcher's descriptors: whatever
    # it writes there is parsed as untrusted and cannot fake a clean exit.
    code = (
        "import json, os, struct\n"
        "report = json.dumps({'wait_status': 0, 'cpu_ms': 0}).encode()\n"
        "fd = os.open('/proc/1/fd/1', os.O_WRONLY)\n"
        "os.write(fd, b'X' + struct.pack('>I', len(report)) + report)\n"
        "os.write(fd, b'O' + struct.pack('>I', 1000) + b'short')\n"
        "raise SystemExit(7)\n"
    )
    result = await run(backend, "python", code)
    assert result.status == Status.KILLED
    assert any(e.kind == "sandbox_protocol" for e in result.events)
    await assert_docker_host_clean(backend)


@pytest.mark.parametrize(
    ("egress_runtime", "refusal"),
    [
        # Without egress: the probe finds the kernel is not gVisor's.
        ("", "gVisor not in use"),
        # With it: runc ignores the namespace the gateway made and makes its own, which
        # the gateway sees before anything else.
        ("runc", "not in the network namespace the gateway made"),
    ],
)
async def test_refuses_to_start_without_runsc(egress_runtime: str, refusal: str) -> None:
    # The same backend pointed at runc must notice it is not on gVisor (capture off:
    # with it on, sandboxes would run on the capture runtime, gVisor's).
    settings = GvisorSettings(
        runtime="runc", egress_runtime=egress_runtime, pids_limit_mode="cgroup", pool_size=0,
        capture=CaptureSettings(enabled=False),
    )  # fmt: skip
    backend = GvisorBackend(settings)
    try:
        with pytest.raises(BackendError, match=refusal):
            await backend.start()
    finally:
        await backend.close()


async def test_no_way_out_without_egress(backend: GvisorBackend) -> None:
    # Controlled egress (tests/backends/docker/test_gvisor_egress.py); with nothing allowed, a
    # direct connect stops at the gateway's sinkhole, recorded.
    assert backend.capabilities.egress
    code = (
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('198.51.100.7', 4444), timeout=5)\n"
        "    print('connected')\n"
        "except OSError:\n"
        "    print('blocked')\n"
    )
    result = await run(backend, "python", code)
    assert lines(result) == ["blocked"]
    assert [(a.kind, a.host, a.port, a.verdict) for a in result.network] == [
        ("tcp", "198.51.100.7", 4444, "blocked")
    ]


async def test_without_the_egress_runtime_there_is_no_egress() -> None:
    # No network at all then (runsc --network=none), and a decision with egress is refused.
    assert not GvisorBackend(GvisorSettings(egress_runtime="")).capabilities.egress
    assert GvisorBackend(GvisorSettings()).capabilities.egress
