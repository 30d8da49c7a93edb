"""The host tracer for real (bpftrace, root): attribution, the end barrier, the cap.

Sandboxes here are plain pid namespaces the test makes (`unshare --pid --fork`), so
what is proven is the tracer's own: a namespace made inside a sandbox stays the
sandbox's, the record holds the last thing done before the end, and a flood costs
the gateway bounded work. The backends' own records are in tests/backends/conformance.py.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import shutil
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from backends.capture.bpftrace import BARRIER_WHICH, UNREGISTER_WHICH
from backends.capture.host import (
    KERNEL_CAP,
    CaptureUnavailable,
    HostCapture,
    HostTracer,
    TracerHub,
    idle_child,
)
from backends.capture.record import Behaviour, BehaviourRecorder
from backends.capture.settings import CaptureSettings
from tests.components import missing_component

pytestmark = pytest.mark.integration


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def tracer() -> AsyncIterator[HostTracer]:
    if os.geteuid() != 0:
        missing_component("the host tracer needs root")
    if shutil.which("unshare") is None:
        missing_component("unshare (util-linux) is missing")
    started = HostTracer(CaptureSettings())
    try:
        await started.start()
    except CaptureUnavailable as exc:
        missing_component(f"behaviour capture unavailable: {exc}")
    try:
        yield started
    finally:
        await started.close()


async def in_namespace(tracer: HostTracer, script: str, register: bool = True) -> Behaviour:
    """Run `script` (sh) as PID 1 of a new pid namespace, followed from its first
    read on; the record once it has exited."""
    proc = await asyncio.create_subprocess_exec(
        "unshare", "--pid", "--fork", "--kill-child", "--", "/bin/sh", "-c",
        f"read go; {script}",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.stdin is not None
    try:
        init = await asyncio.to_thread(idle_child, proc.pid)
        capture = tracer.register(init, BehaviourRecorder(tracer="bpftrace")) if register else None
        proc.stdin.write(b"go\n")
        await proc.stdin.drain()
        proc.stdin.close()
        async with asyncio.timeout(120):
            await proc.wait()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    if capture is None:
        return Behaviour()
    return await tracer.finish(capture)


@pytest.mark.asyncio(loop_scope="module")
async def test_a_nested_pid_namespace_stays_attributed(tracer: HostTracer) -> None:
    tag = secrets.token_hex(4)
    behaviour = await in_namespace(
        tracer, f"unshare --pid --fork -- cat /etc/nested-{tag}; cat /etc/outer-{tag}"
    )
    paths = {f.path for f in behaviour.files}
    assert {f"/etc/nested-{tag}", f"/etc/outer-{tag}"} <= paths, behaviour.as_dict()
    assert any(p.path.endswith("unshare") for p in behaviour.programs), behaviour.as_dict()


@pytest.mark.asyncio(loop_scope="module")
async def test_the_last_attempt_before_the_end_is_recorded(tracer: HostTracer) -> None:
    for _ in range(5):
        tag = secrets.token_hex(4)
        behaviour = await in_namespace(tracer, f"exec cat /root/.ssh/id_rsa-{tag}")
        assert f"/root/.ssh/id_rsa-{tag}" in {f.path for f in behaviour.files}, behaviour


@pytest.mark.asyncio(loop_scope="module")
async def test_a_record_ends_complete_after_a_marker_thread_was_moved(tracer: HostTracer) -> None:
    # Something outside moves the barrier's thread of one CPU to another: its marker
    # must still be made on its own CPU, or that CPU's events were never proven read
    # (the record would end "incomplete" after the barrier's timeout).
    threads = sorted(tracer.markers.threads.items())
    if len(threads) < 2:
        missing_component("a second CPU: with one there is nowhere to move a marker thread to")
    (cpu, thread), (other, _) = threads[0], threads[1]
    assert thread.native_id is not None
    for _ in range(3):
        os.sched_setaffinity(thread.native_id, {other})
        tag = secrets.token_hex(4)
        behaviour = await in_namespace(tracer, f"cat /etc/moved-{tag}")
        assert not behaviour.reason, behaviour.as_dict()
        assert f"/etc/moved-{tag}" in {f.path for f in behaviour.files}, behaviour.as_dict()
        assert os.sched_getaffinity(thread.native_id) == {cpu}


@pytest.mark.asyncio(loop_scope="module")
async def test_unregistered_namespaces_cost_the_gateway_nothing(tracer: HostTracer) -> None:
    tag = secrets.token_hex(4)
    lines, discarded = tracer.demux.lines, tracer.demux.discarded
    # A namespace nobody follows (a pooled sandbox, another gateway's) prints nothing.
    await in_namespace(tracer, f"for i in 1 2 3 4 5; do cat /etc/unfollowed-{tag}; done",
                       register=False)  # fmt: skip
    followed = await in_namespace(tracer, f"cat /etc/followed-{tag}")
    paths = {f.path for f in followed.files}
    assert f"/etc/followed-{tag}" in paths and f"/etc/unfollowed-{tag}" not in paths, paths
    assert tracer.demux.discarded == discarded
    # The followed one's own lines and its barriers: nothing of the other's five opens.
    assert tracer.demux.lines - lines < 40, tracer.demux.lines - lines


@pytest.mark.asyncio(loop_scope="module")
async def test_code_cannot_end_or_reset_its_own_record(tracer: HostTracer) -> None:
    # The markers the gateway uses (barrier, follow, forget), made from inside the
    # sandbox for its own namespace: ignored, so what follows is still recorded and
    # the kernel's cap is not reset.
    tag = secrets.token_hex(4)
    markers = "; ".join(
        f"libc.getpriority({which}, ns)" for which in (BARRIER_WHICH, UNREGISTER_WHICH)
    )
    script = (
        'python3 -c "import ctypes, os\n'
        "libc = ctypes.CDLL(None)\n"
        "ns = os.stat('/proc/self/ns/pid').st_ino\n"
        f"{markers}\n"
        f"try: os.open('/etc/after-markers-{tag}', 0)\n"
        'except OSError: pass"'
    )
    behaviour = await in_namespace(tracer, script)
    paths = {f.path for f in behaviour.files}
    assert f"/etc/after-markers-{tag}" in paths, behaviour.as_dict()
    assert behaviour.reason == "", behaviour.reason


@pytest.mark.asyncio(loop_scope="module")
async def test_backends_share_one_tracer_per_hub() -> None:
    hub = TracerHub()
    first, second = (
        HostCapture(CaptureSettings(), "a", hub),
        HostCapture(CaptureSettings(), "b", hub),
    )
    try:
        await asyncio.gather(first.start(), second.start())
        assert first.status() == (True, "") and second.status() == (True, "")
        assert first.tracer is second.tracer
        # One backend closing leaves the other's capture on.
        await first.close()
        assert second.status() == (True, "")
    finally:
        await first.close()
        await second.close()
        await hub.close()
    assert second.tracer is None


@pytest.mark.asyncio(loop_scope="module")
async def test_a_flood_costs_bounded_work(tracer: HostTracer) -> None:
    flood = (
        'python3 -c "import os\nfor i in range(100000):\n'
        "    try: os.open('/nonexistent/%d' % (i % 1000), 0)\n"
        '    except OSError: pass"'
    )
    lines = tracer.demux.lines
    behaviour = await in_namespace(tracer, flood)
    # The kernel printed at most its cap of this sandbox's events (plus what other
    # processes on the host printed meanwhile); the rest were only counted.
    read = tracer.demux.lines - lines
    assert read < KERNEL_CAP + 20_000, read
    entries = [f for f in behaviour.files if f.path.startswith("/nonexistent/")]
    assert len(behaviour.files) <= 256
    assert sum(f.count for f in entries) + behaviour.dropped >= 100_000
    assert behaviour.dropped >= 100_000 - KERNEL_CAP
