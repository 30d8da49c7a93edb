"""Zero cold start on docker and docker-gvisor, for real: interpreters started ahead
run code as cold ones.

Each program runs on a backend whose containers start their interpreter ahead (the
default) and on one whose launcher starts it once the code is there, on runc and on
runsc, and everything the program can tell about how it was started must agree (the
programs of tests/backends/warm_cases.py). Then what the hand-over must survive: code
past any pipe, a source encoding, a runtime that dies at start-up; and what one
execution leaves is looked for by the next, in a container made while it ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from backends.base import Status
from backends.docker.backend import DockerBackend
from backends.docker.gvisor import GvisorBackend
from backends.docker.settings import DockerSettings, GvisorSettings
from backends.runtimes import RuntimeSettings, default_runtimes
from tests.backends.conformance import run
from tests.backends.conftest import NO_CAPTURE, assert_docker_host_clean, start_docker_backend
from tests.backends.warm_cases import CASES, assert_no_trail, assert_runs_as_cold, seen

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module")]

KINDS = {
    "docker": (DockerBackend, DockerSettings),
    "docker-gvisor": (GvisorBackend, GvisorSettings),
}


@contextlib.asynccontextmanager
async def started(kind: str, **update: object) -> AsyncIterator[DockerBackend]:
    backend_class, settings_class = KINDS[kind]
    update = {"capture": NO_CAPTURE, "pool_size": 1, "pool_max_size": 1, **update}
    settings = settings_class(**update)
    backend = await start_docker_backend(backend_class(settings))  # type: ignore[arg-type]
    try:
        yield backend
    finally:
        await backend.close()


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=sorted(KINDS))
async def pair(request: pytest.FixtureRequest) -> AsyncIterator[tuple[DockerBackend, ...]]:
    async with (
        started(request.param) as warm,
        started(request.param, start_interpreter_ahead=False) as cold,
    ):
        yield warm, cold


def parent_for_pid(code: str) -> str:
    """The program asks for its parent's pid instead of its own: under runc the
    container's pids differ from one container to the next, warm or cold (runc's
    own start-up processes take the first ones); the parent is the launcher, 1."""
    for own, parent in (
        ("os.getpid(), os.getppid()", "os.getppid()"),
        (" $$;", " $PPID;"),
        ("process.pid", "process.ppid"),
    ):
        code = code.replace(own, parent)
    return code


@pytest.mark.parametrize(
    ("language", "code", "limits"),
    [(lang, parent_for_pid(code), limits) for lang, _, code, limits in CASES],
    ids=[f"{lang}-{name}" for lang, name, _, _ in CASES],
)
async def test_code_runs_as_it_would_have_cold(
    pair: tuple[DockerBackend, DockerBackend], language: str, code: str, limits: dict[str, float]
) -> None:
    await assert_runs_as_cold(*pair, language, code, limits)


# Past any pipe (1 MiB here without CAP_SYS_RESOURCE): the rest is fed as it is read.
# bash reads a pipe one byte per call: beyond `ahead_unbuffered_max_bytes` (16 KiB on
# runc) a bash started on the file runs it, below it the one started ahead does.
BIG_BASH = "".join(f"echo line-{i:07d}-{'x' * 60}\n" for i in range(40_000)) + "echo end\n"
SMALL_BASH = "".join(f"echo line-{i:07d}-{'x' * 60}\n" for i in range(200)) + "echo end\n"
BIG_PYTHON = f"s = '{'x' * 1_800_000}'\nprint('read', len(s), len(open(__file__).read()))\n"


@pytest.mark.parametrize(
    ("language", "code"),
    [("bash", BIG_BASH), ("bash", SMALL_BASH), ("python", BIG_PYTHON),
     ("python", "# coding: latin-1\ns = 'é' * 3\nprint(s, ascii(s), __file__)\n"),
     ("python", f"# -*- coding: cp1252 -*-\nx = '{'€' * 600_000}'\nprint(len(x), x[-3:])\n")],
    ids=["bash-3MiB", "bash-15KiB", "python-1.8MiB", "python-latin-1", "python-cp1252-1.8MiB"],
)  # fmt: skip
async def test_the_hand_over_survives_what_a_pipe_cannot_hold(
    pair: tuple[DockerBackend, DockerBackend], language: str, code: str
) -> None:
    warm, cold = pair
    await warm.wait_settled()
    hot = await run(warm, language, code, output_bytes=4 << 20, timeout_s=60)
    plain = await run(cold, language, code, output_bytes=4 << 20, timeout_s=60)
    assert hot.status == Status.OK, hot.stderr
    assert seen(hot) == seen(plain)


async def test_a_pooled_container_waits_in_its_interpreter() -> None:
    async with started("docker") as backend:
        await backend.wait_settled()
        (container,) = backend.pool._ready
        # The launcher's one child: python3 on the code file, its start-up done and
        # blocked reading the pipe that stands where the code will be.
        with open(f"/proc/{container.pid}/task/{container.pid}/children") as children:
            (child,) = children.read().split()
        assert os.path.basename(os.readlink(f"/proc/{child}/exe")).startswith("python3")
        with open(f"/proc/{child}/cmdline", "rb") as cmdline:
            assert cmdline.read().split(b"\0")[-2] == b"/code/main.py"
        # Ready is sent once the interpreter has the FIFO open or is blocked opening
        # it: its read follows a moment later.
        for _ in range(200):
            with open(f"/proc/{child}/wchan") as wchan:
                waiting = wchan.read()
            if waiting.endswith("pipe_read"):  # anon_pipe_read on 6.x
                break
            await asyncio.sleep(0.01)
        assert waiting.endswith("pipe_read"), waiting
        result = await run(backend, "python", "print(1)")
        assert (result.status, result.stdout) == (Status.OK, b"1\n")


# A runtime whose interpreter exits when its code file is a pipe (as a broken
# runtime would at start-up) and runs it otherwise.
PICKY = (
    "import os, stat, sys; f = sys.argv[1]; "
    "stat.S_ISFIFO(os.stat(f).st_mode) and sys.exit(3); "
    "os.execv('/usr/bin/python3', ['/usr/bin/python3', '-I', f])"
)


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_a_runtime_that_dies_at_start_up_is_started_again_cold(kind: str) -> None:
    runtimes = {**default_runtimes(), "python": RuntimeSettings(
        argv=["/usr/bin/python3", "-I", "-c", PICKY], filename="main.py")}  # fmt: skip
    async with started(kind, runtimes=runtimes) as backend:
        for _ in range(2):
            await backend.wait_settled()
            result = await run(backend, "python", "print('ran', __file__)")
            assert (result.status, result.stdout) == (Status.OK, b"ran /code/main.py\n")
        await assert_docker_host_clean(backend)


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_nothing_of_one_execution_is_visible_to_the_next(kind: str) -> None:
    async with started(kind, pool_size=2, pool_max_size=2) as backend:
        await backend.wait_settled()
        await assert_no_trail(backend)
        await assert_docker_host_clean(backend)


async def test_the_pool_follows_the_languages_asked_for() -> None:
    async with started("docker", pool_size=2, pool_max_size=2) as backend:
        await backend.wait_settled()

        def languages() -> list[str]:
            return sorted(c.shape.language for c in backend.pool._ready)

        assert languages() == ["python", "python"]
        for _ in range(16):
            assert (await run(backend, "bash", "echo hi")).stdout == b"hi\n"
        await backend.wait_settled()
        assert languages() == ["bash", "bash"]
        for _ in range(8):
            assert (await run(backend, "javascript", "console.log(1)")).stdout == b"1\n"
        backend.pool.tick()
        await backend.wait_settled()
        assert languages() == ["bash", "javascript"]
        hits = backend.pool.hits
        await asyncio.gather(run(backend, "bash", "true"), run(backend, "javascript", "1"))
        assert backend.pool.hits == hits + 2
        await assert_docker_host_clean(backend)
