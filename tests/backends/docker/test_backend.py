"""The docker backend for real (runc): the conformance suite plus hostile programs.

Needs a running engine and the sandbox image (`deploy/docker/start-dockerd.sh`,
`make images`); CI provides both, elsewhere the tests skip. One backend serves the
whole module (starting one costs a probe container); every hostile test checks the
engine afterwards: no container of this backend instance is left but those waiting
in its pool.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from backends.base import BackendError, Status
from backends.capture.settings import CaptureSettings
from backends.docker.backend import DockerBackend
from backends.docker.settings import DockerSettings
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


backend = module_docker_backend(lambda tracers: DockerBackend(DockerSettings(), tracers=tracers))


@pytest.fixture
def residue_check(backend: DockerBackend) -> Callable[[], Awaitable[None]]:
    return lambda: assert_docker_host_clean(backend)


class TestDockerConformance(BackendConformance):
    pass


class TestDockerBehaviour(BehaviourConformance):
    pass


# --- hostile programs --------------------------------------------------------------


async def test_fork_bomb(backend: DockerBackend) -> None:
    result = await run(backend, "bash", FORK_BOMB, timeout_s=3.0, pids=32)
    assert result.status == Status.TIMEOUT
    # The limit held: never more processes than it allows (+ the launcher).
    assert 1 <= fork_bomb_peak(result) <= 32 + 1 + EXITING_SLACK, result.stdout
    assert any(e.kind == "deadline" for e in result.events)
    await assert_docker_host_clean(backend)


async def test_memory_bomb(backend: DockerBackend) -> None:
    code = "import os\nx = []\nwhile True:\n    x.append(os.urandom(1) * (16 << 20))"
    result = await run(backend, "python", code, memory_mb=48)
    assert result.status == Status.OOM
    assert any(e.kind == "oom" for e in result.events)
    await assert_docker_host_clean(backend)


async def test_disk_fill(backend: DockerBackend) -> None:
    code = "cat /dev/zero > /workspace/fill\ncat /dev/zero > /tmp/fill\ndf -k /workspace | tail -1"
    result = await run(backend, "bash", code, disk_mb=4)
    assert result.status == Status.OK, result.stderr
    assert b"No space left on device" in result.stderr
    assert any(e.kind == "disk_limit" for e in result.events)
    assert all(f.size <= 4 << 20 for f in result.files)
    await assert_docker_host_clean(backend)


async def test_init_cannot_be_killed_or_read(backend: DockerBackend) -> None:
    # The launcher (PID 1) carries the frames; the program may neither kill it nor
    # reach its descriptors (it is not dumpable).
    code = (
        "import os, signal\n"
        "for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP):\n"
        "    try: os.kill(1, sig)\n"
        "    except OSError as e: print('kill', e.errno)\n"
        "for p in ('/proc/1/fd/1', '/proc/1/environ', '/proc/1/mem'):\n"
        "    try: open(p, 'rb').read(1); print('read', p)\n"
        "    except OSError as e: print('no', e.errno)\n"
        "print('alive')\n"
    )
    result = await run(backend, "python", code)
    assert result.status == Status.OK, result.stderr
    assert b"read" not in result.stdout
    assert lines(result)[-1] == "alive"


async def test_binary_stdin_and_files_pass_untouched(backend: DockerBackend) -> None:
    # Every byte value, including the terminal's detach keys (ctrl-p ctrl-q).
    blob = bytes(range(256)) * 64 + b"\x10\x11"
    code = "import sys\nsys.stdout.buffer.write(sys.stdin.buffer.read()[::-1])"
    result = await run(backend, "python", code, stdin=blob)
    assert result.status == Status.OK, result.stderr
    assert result.stdout == blob[::-1]


async def test_health_and_capabilities(backend: DockerBackend) -> None:
    health = await backend.health()
    assert health.ok, health.detail
    assert "engine reachable" in health.detail
    caps = backend.capabilities
    assert caps.languages == {"python", "bash", "javascript"}
    assert caps.usage_accounting and caps.egress  # runc: backends/egress/
    assert caps.extra["runtime"] == "runc"


async def test_required_capture_unavailable_fails_closed() -> None:
    missing = CaptureSettings(required=True, tracer_path="/nonexistent/bpftrace")
    backend = DockerBackend(DockerSettings(pool_size=0, capture=missing))
    with pytest.raises(BackendError, match="behaviour capture is required"):
        await backend.start()
    assert not backend.capture_status()[0]
    await backend.close()
