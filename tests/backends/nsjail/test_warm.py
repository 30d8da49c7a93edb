"""Zero cold start on nsjail, for real: interpreters started ahead run code as cold ones.

Each program runs twice, on a backend whose sandboxes start their interpreter
ahead (the default) and on one that starts it at launch, and everything the
program can tell about how it was started must agree: `__main__`, its file name
in tracebacks, `sys.argv`, open descriptors, loaded modules, exit status and
signals, stdin, output caps. Then hostile: what one execution leaves anywhere it
can write is looked for by the next, in a sandbox made while the first ran.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from backends.base import Status
from backends.capture.host import idle_child
from backends.nsjail.backend import NsjailBackend
from backends.nsjail.settings import NsjailSettings
from tests.backends.conformance import run
from tests.backends.conftest import assert_nsjail_host_clean
from tests.backends.warm_cases import CASES, assert_no_trail, assert_runs_as_cold

pytestmark = pytest.mark.integration


@contextlib.asynccontextmanager
async def backend_with(settings: NsjailSettings, **update: object) -> AsyncIterator[NsjailBackend]:
    backend = NsjailBackend(settings.model_copy(update=update))
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()


@pytest_asyncio.fixture
async def pair(
    nsjail_settings: NsjailSettings,
) -> AsyncIterator[tuple[NsjailBackend, NsjailBackend]]:
    async with (
        backend_with(nsjail_settings, warm_pool_size=1) as warm,
        backend_with(nsjail_settings, warm_pool_size=1, start_interpreter_ahead=False) as cold,
    ):
        yield warm, cold


@pytest.mark.parametrize(
    ("language", "code", "limits"),
    [(lang, code, limits) for lang, _, code, limits in CASES],
    ids=[f"{lang}-{name}" for lang, name, _, _ in CASES],
)
async def test_code_runs_as_it_would_have_cold(
    pair: tuple[NsjailBackend, NsjailBackend], language: str, code: str, limits: dict[str, float]
) -> None:
    await assert_runs_as_cold(*pair, language, code, limits)


async def test_a_pooled_sandbox_waits_in_its_interpreter(nsjail_settings: NsjailSettings) -> None:
    async with backend_with(nsjail_settings, warm_pool_size=1) as backend:
        await backend.wait_settled()
        (sandbox,) = backend.waiting()
        assert sandbox.proc is not None
        init = await asyncio.to_thread(idle_child, sandbox.proc.pid, 10.0)
        # Started and blocked opening the code file's FIFO: its start-up is done.
        assert os.path.basename(os.readlink(f"/proc/{init}/exe")).startswith("python3")
        with open(f"/proc/{init}/wchan") as wchan:
            assert wchan.read() == "wait_for_partner"
        with open(f"/proc/{init}/cmdline", "rb") as cmdline:
            assert cmdline.read().split(b"\0")[-2] == b"/code/main.py"
        result = await run(backend, "python", "print(1)")
        assert (result.status, result.stdout) == (Status.OK, b"1\n")


async def test_nothing_of_one_execution_is_visible_to_the_next(
    nsjail_settings: NsjailSettings,
) -> None:
    async with backend_with(nsjail_settings, warm_pool_size=2) as backend:
        await backend.wait_settled()
        await assert_no_trail(backend)
        await assert_nsjail_host_clean(backend)


async def test_the_pool_follows_the_languages_asked_for(nsjail_settings: NsjailSettings) -> None:
    async with backend_with(nsjail_settings, warm_pool_size=2) as backend:
        await backend.wait_settled()
        assert backend.ready_languages() == {"python": 2}
        for _ in range(3):
            assert (await run(backend, "bash", "echo hi")).stdout == b"hi\n"
        await backend.wait_settled()
        assert backend.ready_languages() == {"bash": 2}
        for _ in range(3):
            assert (await run(backend, "javascript", "console.log(1)")).stdout == b"1\n"
        await backend.wait_settled()
        assert backend.ready_languages() == {"bash": 1, "javascript": 1}
        await assert_nsjail_host_clean(backend)
