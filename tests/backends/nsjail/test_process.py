"""`spawn`: a process started in a given network namespace, its pipes and exit on the
loop, and nothing left when the spawn is cancelled or the process is killed."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator

import pytest

from backends.egress.boundary import BoundaryFds, open_boundary
from backends.nsjail.process import spawn
from tests.backends.egress.test_boundary import require_root


@pytest.fixture
async def boundary() -> AsyncIterator[BoundaryFds]:
    require_root()
    fds = await asyncio.to_thread(open_boundary)
    yield fds
    fds.close()


async def test_the_process_starts_in_the_namespace_given(boundary: BoundaryFds) -> None:
    assert boundary.netns is not None
    proc = await spawn(["/bin/sh", "-c", "readlink /proc/self/ns/net"], (), boundary.netns)
    assert proc.stdout is not None and proc.stdin is not None
    proc.stdin.close()
    out = await proc.stdout.read()
    assert await proc.wait() == 0 and proc.returncode == 0
    assert out.decode().strip() == os.readlink(f"/proc/self/fd/{boundary.netns}")
    # ...and the gateway's own threads stayed where they were.
    assert out.decode().strip() != os.readlink("/proc/self/ns/net")


async def test_the_gateways_own_namespace_is_refused() -> None:
    require_root()
    own = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        with pytest.raises(OSError, match="gateway's own network namespace"):
            await spawn(["/bin/true"], (), own)
    finally:
        os.close(own)


async def test_stdin_stdout_stderr_and_the_exit_status() -> None:
    proc = await spawn(["/bin/sh", "-c", "cat; echo err >&2; exit 7"], ())
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.write(b"in\n")
    await proc.stdin.drain()
    proc.stdin.close()
    out, err = await asyncio.gather(proc.stdout.read(), proc.stderr.read())
    assert (out, err, await proc.wait()) == (b"in\n", b"err\n", 7)


async def test_a_signal_is_a_negative_status_and_waiting_twice_is_fine() -> None:
    proc = await spawn(["/bin/sleep", "30"], ())
    os.kill(proc.pid, signal.SIGKILL)
    assert await proc.wait() == -signal.SIGKILL
    assert await proc.wait() == -signal.SIGKILL
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)  # reaped: no zombie left behind


async def test_a_cancelled_wait_does_not_lose_the_exit() -> None:
    proc = await spawn(["/bin/sh", "-c", "sleep 0.2"], ())
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.01):
            await proc.wait()
    assert await proc.wait() == 0


async def test_a_cancelled_spawn_leaves_no_process(boundary: BoundaryFds) -> None:
    marker = f"execgate-cancelled-{os.getpid()}"
    for _ in range(20):
        task = asyncio.ensure_future(
            spawn(["/bin/sh", "-c", f"exec -a {marker} sleep 30"], (), boundary.netns)
        )
        await asyncio.sleep(0)
        task.cancel()
        try:
            proc = await task
        except asyncio.CancelledError:
            continue
        os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()
    for _ in range(100):
        if not _running(marker):
            break
        await asyncio.sleep(0.05)
    assert not _running(marker)


def _running(marker: str) -> bool:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().startswith(marker.encode()):
                    return True
        except OSError:
            continue
    return False
