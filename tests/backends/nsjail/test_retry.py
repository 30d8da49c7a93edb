"""Retry where nothing ran, on the nsjail backend, for real.

Start failures are injected where nsjail is started (a factory whose first spawns
name a binary that does not exist: the exec fails as it would for a vanished or
broken nsjail) or provoked (the nsjail process of a sandbox made ahead killed from
outside before it is used). A sandbox that fails before its launch line is replaced
by a fresh one, each failure a `start_failed` event and a count; once the launch
line is sent nothing is retried; nothing is left on the host.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator

import pytest

from backends.attempts import exited
from backends.base import BackendError, SandboxStartError, Status
from backends.nsjail.backend import NsjailBackend
from backends.nsjail.sandbox import Sandbox, SandboxFactory
from backends.nsjail.settings import NsjailSettings
from tests.backends.conformance import run
from tests.backends.conftest import assert_nsjail_host_clean, processes_with_uid, until

pytestmark = pytest.mark.integration


class FlakyFactory(SandboxFactory):
    """The real factory; its next `refuse` sandboxes get an nsjail that cannot exec."""

    refuse = 0
    made = 0

    def argv(self, sandbox: Sandbox) -> list[str]:
        self.made += 1
        argv = super().argv(sandbox)
        if self.refuse:
            self.refuse -= 1
            return ["/nonexistent/execgate-test/nsjail", *argv[1:]]
        return argv


class FlakyNsjail(NsjailBackend):
    Factory = FlakyFactory

    @property
    def factory(self) -> FlakyFactory:
        factory = self._require_factory()
        assert isinstance(factory, FlakyFactory)
        return factory


@contextlib.asynccontextmanager
async def started(settings: NsjailSettings, **update: object) -> AsyncIterator[FlakyNsjail]:
    backend = FlakyNsjail(settings.model_copy(update=update))
    await backend.start()
    try:
        yield backend
    finally:
        await backend.close()


async def test_a_failed_start_is_retried_on_a_fresh_sandbox(
    nsjail_settings: NsjailSettings,
) -> None:
    async with started(nsjail_settings, warm_pool_size=0) as backend:
        backend.factory.refuse = 2
        result = await run(backend, "python", "print('third time')")
        assert result.status == Status.OK, result.stderr
        assert result.stdout == b"third time\n"
        failed = [e for e in result.events if e.kind == "start_failed"]
        assert [e.detail.split(":")[0] for e in failed] == ["start", "start"], result.events
        assert backend.start_failures.counts == {"start": 2}
        await assert_nsjail_host_clean(backend)


async def test_when_every_try_fails_the_error_carries_each_failure(
    nsjail_settings: NsjailSettings,
) -> None:
    async with started(nsjail_settings, warm_pool_size=0, start_attempts=2) as backend:
        backend.factory.refuse = 100
        made = backend.factory.made
        with pytest.raises(SandboxStartError, match=r"\(2 tries\)") as caught:
            await run(backend, "python", "print('never')")
        assert len(caught.value.events) == 2 and backend.factory.made - made == 2
        backend.factory.refuse = 0
        await assert_nsjail_host_clean(backend)


async def test_a_pooled_sandbox_killed_from_outside_is_replaced(
    nsjail_settings: NsjailSettings,
) -> None:
    async with started(nsjail_settings, warm_pool_size=1) as backend:
        await backend.wait_settled()
        (sandbox,) = backend.waiting()
        assert sandbox.proc is not None
        os.kill(sandbox.proc.pid, signal.SIGKILL)  # nsjail itself, from outside
        await until(lambda: exited(sandbox.pidfd), "nsjail to die")
        result = await run(backend, "python", "print('on a fresh one')")
        assert result.status == Status.OK, result.stderr
        assert result.stdout == b"on a fresh one\n"
        dead = [e for e in result.events if e.detail.startswith("dead: ")]
        assert len(dead) == 1 and sandbox.name in dead[0].detail, result.events
        assert backend.start_failures.counts == {"dead": 1}
        await assert_nsjail_host_clean(backend)


async def test_nothing_is_retried_once_the_launch_line_was_sent(
    nsjail_settings: NsjailSettings,
) -> None:
    async with started(nsjail_settings, warm_pool_size=0) as backend:
        made = backend.factory.made
        task = asyncio.ensure_future(run(backend, "python", "import time\ntime.sleep(60)"))
        await until(lambda: backend.running_sandboxes, "the execution to start")
        (victim,) = backend._live.values()
        assert victim.proc is not None
        os.kill(victim.proc.pid, signal.SIGKILL)  # nsjail dies under the program
        # Reported as it ended (a result, or the sandbox's failure: the gateway's 503),
        # never as a start failure, never run again.
        try:
            result = await task
        except SandboxStartError as exc:
            raise AssertionError("a handed-over run was retried as a start failure") from exc
        except BackendError as exc:
            assert not exc.events
        else:
            assert result.status != Status.OK
            assert not any(e.kind == "start_failed" for e in result.events)
        assert backend.factory.made - made == 1
        # The jailed program, orphaned by nsjail's death, is killed with its cgroup;
        # it may take a moment to be reaped by the host's init.
        uid = backend.settings.sandbox_uid
        await until(lambda: not processes_with_uid(uid), "the orphaned program to be reaped")
        await assert_nsjail_host_clean(backend)
