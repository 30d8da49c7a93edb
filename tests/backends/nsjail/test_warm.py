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
import secrets
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from backends.base import Limits, Status
from backends.capture.host import TracerHub
from backends.capture.settings import CaptureSettings
from backends.cgroups import ExecCgroup, V1Cgroup, V2Cgroup
from backends.nsjail.backend import NsjailBackend
from backends.nsjail.sandbox import IDLE_LIMITS, Sandbox, cgroup_limits
from backends.nsjail.settings import NsjailSettings
from tests.backends.conformance import RUN_LIMITS, run, run_captured
from tests.backends.conftest import assert_nsjail_host_clean
from tests.backends.warm_cases import CASES, assert_no_trail, assert_runs_as_cold
from tests.waiting import until

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
        # Settled means started: already blocked opening the code file's FIFO (the
        # bench's settled figures count on nothing of the pool's start-up being left).
        with open(f"/proc/{sandbox.proc.pid}/task/{sandbox.proc.pid}/children") as children:
            init = int(children.read().split()[0])
        assert os.path.basename(os.readlink(f"/proc/{init}/exe")).startswith("python3")
        with open(f"/proc/{init}/wchan") as wchan:
            assert wchan.read() == "wait_for_partner"
        with open(f"/proc/{init}/cmdline", "rb") as cmdline:
            assert cmdline.read().split(b"\0")[-2] == b"/code/main.py"
        result = await run(backend, "python", "print(1)")
        assert (result.status, result.stdout) == (Status.OK, b"1\n")


# Forks until refused (or 100), each child waiting; prints how many it got.
FORKS = """
import os, time
n = 0
try:
    while n < 100:
        if os.fork() == 0:
            time.sleep(3)
            os._exit(0)
        n += 1
except OSError:
    pass
print(n)
"""
MEMORY_BOMB = "import os\nx = []\nwhile True:\n    x.append(os.urandom(1) * (16 << 20))"
ROOMY = {"memory_mb": 320, "pids": 48}


def held_pids_max(cgroup: ExecCgroup) -> str:
    """pids.max as the kernel holds it."""
    if isinstance(cgroup, V1Cgroup):
        return (cgroup.dirs["pids"] / "pids.max").read_text().strip()
    assert isinstance(cgroup, V2Cgroup)
    return (cgroup.dir / "pids.max").read_text().strip()


async def primed_roomy(backend: NsjailBackend) -> Sandbox:
    """The pool's python sandbox, primed after a roomy request."""
    assert (await run(backend, "python", "print(1)", **ROOMY)).status == Status.OK
    await backend.wait_settled()
    (sandbox,) = backend.waiting()
    assert sandbox.child, "not primed"
    roomy = cgroup_limits(backend.clamp(Limits(**{**RUN_LIMITS, **ROOMY})))
    assert sandbox.cgroup.applied == roomy
    assert held_pids_max(sandbox.cgroup) == str(roomy.pids_max)
    return sandbox


async def test_a_primed_sandbox_holds_a_request_to_its_own_limits(
    nsjail_settings: NsjailSettings,
) -> None:
    """A sandbox waiting in the pool is primed, off the request path, with the
    limits its language's latest request had. A request of a tighter shape that
    claims it is still held to its own: programs that push against the pids and
    memory limits stop where that request's limits are, not the roomy ones."""
    async with backend_with(nsjail_settings, warm_pool_size=1) as backend:
        await primed_roomy(backend)
        tight = await run(backend, "python", FORKS, timeout_s=5.0, pids=8)
        assert tight.status == Status.OK, tight.stderr
        # pids.max is 9 (+ nsjail): the interpreter and at most 7 children.
        assert 1 <= int(tight.stdout) <= 8, tight.stdout
        await primed_roomy(backend)
        roomy = await run(backend, "python", FORKS, timeout_s=5.0, **ROOMY)
        assert int(roomy.stdout) > 8  # the same program, where the limit allows more
        await primed_roomy(backend)
        bomb = await run(backend, "python", MEMORY_BOMB, memory_mb=48)
        assert bomb.status == Status.OOM
        assert bomb.usage.max_rss_kb <= 48 * 1024
        await assert_nsjail_host_clean(backend)


async def test_a_shape_an_idle_interpreter_would_not_fit_is_not_primed(
    nsjail_settings: NsjailSettings,
) -> None:
    """Priming never tightens a waiting sandbox below its idle limits: the next
    request, of whatever shape, must find its interpreter alive."""
    async with backend_with(nsjail_settings, warm_pool_size=1) as backend:
        result = await run(backend, "python", "print(1)", pids=4, memory_mb=64)
        assert result.status == Status.OK, result.stderr
        await backend.wait_settled()
        (sandbox,) = backend.waiting()
        assert sandbox.child  # primed: its baseline, not the tight limits
        assert sandbox.cgroup.applied == IDLE_LIMITS
        assert held_pids_max(sandbox.cgroup) == str(IDLE_LIMITS.pids_max)
        again = await run(backend, "python", "print(2)")
        assert (again.status, again.stdout) == (Status.OK, b"2\n")
        await assert_nsjail_host_clean(backend)


async def test_a_primed_sandbox_is_followed_and_lets_go_when_unused(
    nsjail_settings: NsjailSettings, tracer_hub: TracerHub
) -> None:
    """With behaviour capture on, priming also registers the waiting sandbox with
    the host tracer. The claim takes that registration: the record holds the code's
    own attempt, complete. A primed sandbox disposed of unclaimed (the pool turning
    to another language, the backend closing) leaves no registration behind."""
    settings = nsjail_settings.model_copy(
        update={"warm_pool_size": 1, "capture": CaptureSettings()}
    )
    backend = NsjailBackend(settings, tracers=tracer_hub)
    await backend.start()
    try:
        tracer = backend.capture.tracer
        assert tracer is not None, backend.capture_status()
        await backend.wait_settled()
        (sandbox,) = backend.waiting()
        assert sandbox.capture is not None, "not followed while it waited"
        assert sandbox.capture.ns in tracer.demux.captures
        probe = f"/tmp/execgate-probe-primed-{secrets.token_hex(4)}"
        code = f"try:\n    open({probe!r})\nexcept OSError:\n    pass\n"
        result = await run_captured(backend, "python", code)
        behaviour = result.behaviour
        assert behaviour is not None and not behaviour.reason.startswith("incomplete")
        assert {f.path for f in behaviour.files if f.path.startswith("/tmp/execgate-probe")} == {
            probe
        }
        assert sandbox.capture is None  # the claim's now, and ended with its record
        # The pool turns to bash: the primed python sandbox goes, unclaimed.
        await backend.wait_settled()
        (waiting,) = backend.waiting()
        assert waiting.capture is not None
        unclaimed = waiting.capture.ns
        for _ in range(3):
            assert (await run(backend, "bash", "echo hi")).stdout == b"hi\n"
        await backend.wait_settled()
        assert backend.ready_languages() == {"bash": 1}
        assert unclaimed not in tracer.demux.captures
        (last,) = backend.waiting()
        assert last.capture is not None
        closing = last.capture.ns
    finally:
        await backend.close()
    assert closing not in tracer.demux.captures
    await assert_nsjail_host_clean(backend)


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


async def test_refills_and_teardowns_give_way_to_a_running_execution(
    nsjail_settings: NsjailSettings,
) -> None:
    """While an execution runs and a sandbox still waits for the next request, the
    sandboxes made ahead and the teardown of one whose program has ended wait; once
    the execution has ended they all happen, and nothing is left behind."""
    async with backend_with(nsjail_settings, warm_pool_size=3) as backend:
        backend.give_way.max_s = 60  # only the execution's end lets them go here
        await backend.wait_settled()
        runs_dir = backend.workspaces.runs_dir
        made_ahead = set(os.listdir(runs_dir))
        assert len(made_ahead) == 3
        waited = backend.give_way.waited  # the start-up's own smoke tests gave way too
        long = asyncio.ensure_future(run(backend, "python", "import time; time.sleep(4)"))
        await until(lambda: len(backend.running_sandboxes) == 1, what="the long run began")
        quick = await run(backend, "python", "print(1)")
        assert (quick.status, quick.stdout) == (Status.OK, b"1\n")
        await asyncio.sleep(0.3)  # far beyond the quiet moment the work waits for
        during = (
            set(os.listdir(runs_dir)),
            len(backend.waiting()),
            backend.give_way.waited - waited,
        )
        assert not long.done(), "the long run ended early: nothing was proven"
        # Nothing made, nothing torn down: the quick run's sandbox is still there.
        assert during == (made_ahead, 1, 0)
        assert (await long).status == Status.OK
        await backend.wait_settled()
        assert len(backend.waiting()) == 3
        after = set(os.listdir(runs_dir))
        assert len(after) == 3 and len(after & made_ahead) == 1  # the two used are gone
        assert backend.give_way.waited - waited >= 3  # two refills, the quick run's teardown
        await assert_nsjail_host_clean(backend)


async def test_a_refill_with_nothing_waiting_starts_at_once(
    nsjail_settings: NsjailSettings,
) -> None:
    """The give-way never leaves the next request without a sandbox: with none of
    its language waiting, a refill starts while another execution still runs."""
    async with backend_with(nsjail_settings, warm_pool_size=1) as backend:
        backend.give_way.max_s = 60
        await backend.wait_settled()
        long = asyncio.ensure_future(run(backend, "python", "import time; time.sleep(4)"))
        await until(lambda: len(backend.running_sandboxes) == 1, what="the long run began")
        assert backend.waiting() == ()
        quick = await run(backend, "python", "print(1)")  # made on demand
        assert quick.stdout == b"1\n"
        await until(lambda: len(backend.waiting()) == 1, what="the refill")
        assert not long.done(), "the long run ended early: nothing was proven"
        assert (await long).status == Status.OK
        await backend.wait_settled()
        await assert_nsjail_host_clean(backend)
