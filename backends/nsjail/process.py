"""The nsjail process: spawned ahead, then fed stdin, capped, given a deadline.

Output is read incrementally; once stdout and stderr together reach the cap
we stop keeping it and kill the sandbox. The deadline is ours (nsjail's
--time_limit is only a backstop). Killing is the caller's: it owns the cgroup
that holds nsjail and everything it started.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from backends.base import OutputSink
from backends.egress.netns import join, run_in_thread

READ_CHUNK = 1 << 16
# After the kill, how long the pipes and the process may take to wind down.
SETTLE_TIMEOUT_S = 10.0
# How long nsjail may take to notice its child died before it is killed too.
GRACE_S = 2.0

Kill = Callable[[frozenset[int]], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ProcessOutcome:
    returncode: int
    stdout: bytes
    stderr: bytes
    truncated_stdout: bool
    truncated_stderr: bool
    output_limit_hit: bool
    deadline_hit: bool
    stopped: bool
    duration_ms: int


class _Capture:
    """stdout and stderr share one byte budget."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0
        self.hit = asyncio.Event()

    async def pump(
        self,
        reader: asyncio.StreamReader,
        buf: bytearray,
        stream: str,
        on_output: OutputSink | None,
    ) -> bool:
        """Read to EOF, keeping bytes while under the cap; True when any was dropped.

        Past the cap the pipe is still drained (and the caller kills the sandbox),
        so no writer blocks on it and the pipe closes cleanly. What is kept also
        goes to `on_output` as it arrives."""
        cut = False
        while chunk := await reader.read(READ_CHUNK):
            room = self.limit - self.total
            if len(chunk) > room:
                chunk = chunk[:room]
                self.total = self.limit
                cut = True
                self.hit.set()
            else:
                self.total += len(chunk)
            buf += chunk
            if chunk and on_output is not None:
                on_output(stream, chunk)
        return cut


class JailProcess:
    """nsjail (behind its shim, which joins the sandbox's network namespace; the
    /bin/sh one is started from a thread inside it instead), started from a worker
    thread: asyncio's subprocess API starts children from the event loop's thread
    only, in the gateway's own namespace, which cost an `nsenter` exec per sandbox
    to move into the boundary's. The pipes are the loop's (as asyncio's own), and
    the exit is learnt from a pidfd on the loop, with no watcher thread per
    process."""

    def __init__(self, popen: subprocess.Popen[bytes], pidfd: int) -> None:
        self.pid = popen.pid
        self.returncode: int | None = None
        self._popen = popen
        self._pidfd = pidfd
        self._exit: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.stdin: asyncio.StreamWriter | None = None
        self.stdout: asyncio.StreamReader | None = None
        self.stderr: asyncio.StreamReader | None = None

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        popen = self._popen
        assert popen.stdin is not None and popen.stdout is not None and popen.stderr is not None
        readers = []
        for pipe in (popen.stdout, popen.stderr):
            reader = asyncio.StreamReader(limit=READ_CHUNK)
            await loop.connect_read_pipe(lambda r=reader: asyncio.StreamReaderProtocol(r), pipe)
            readers.append(reader)
        self.stdout, self.stderr = readers
        transport, protocol = await loop.connect_write_pipe(
            asyncio.streams.FlowControlMixin, popen.stdin
        )
        self.stdin = asyncio.StreamWriter(transport, protocol, None, loop)
        loop.add_reader(self._pidfd, self._reap)

    def _reap(self) -> None:
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            pid, status = self.pid, 255 << 8  # reaped by someone else: not ours to know
        if pid == 0:
            return  # readable before the zombie is there to reap: look again
        asyncio.get_running_loop().remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = -1
        self.returncode = self._popen.returncode = os.waitstatus_to_exitcode(status)
        self._exit.set_result(self.returncode)

    async def wait(self) -> int:
        return await asyncio.shield(self._exit)


async def spawn(
    argv: Sequence[str], pass_fds: Sequence[int], netns: int | None = None
) -> JailProcess:
    """Start argv with an empty environment and piped stdin, stdout, stderr, in the
    network namespace `netns` (a descriptor; None: the gateway's own, or the one
    argv's shim joins)."""

    def start() -> tuple[subprocess.Popen[bytes], int]:
        if netns is not None:
            join(netns)  # this thread only, and it ends after the fork
        popen = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            pass_fds=tuple(pass_fds), env={}, start_new_session=True,
        )  # fmt: skip
        try:
            # Only JailProcess reaps it, so the pid is still this child's.
            return popen, os.pidfd_open(popen.pid)
        except BaseException:
            popen.kill()
            popen.wait()
            raise

    # Joining a namespace taints the thread that does it: that one is a thread of
    # its own, which ends.
    on_thread = start if netns is None else functools.partial(run_in_thread, start)
    started = asyncio.ensure_future(asyncio.to_thread(on_thread))
    try:
        popen, pidfd = await asyncio.shield(started)
    except asyncio.CancelledError:
        # The thread finishes anyway: what it started is stopped and reaped.
        started.add_done_callback(_discard_started)
        raise
    proc = JailProcess(popen, pidfd)
    try:
        await proc._connect()
    except BaseException:
        _discard(popen, pidfd)
        raise
    return proc


def _discard_started(started: asyncio.Future[tuple[subprocess.Popen[bytes], int]]) -> None:
    if not started.cancelled() and started.exception() is None:
        _discard(*started.result())


def _discard(popen: subprocess.Popen[bytes], pidfd: int) -> None:
    """Kill a process never handed out; reaped on a thread of its own."""
    popen.kill()
    for pipe in (popen.stdin, popen.stdout, popen.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()
    with contextlib.suppress(OSError):
        os.close(pidfd)
    threading.Thread(target=popen.wait, name="execgate-reap", daemon=True).start()


async def _feed(writer: asyncio.StreamWriter, data: bytes) -> None:
    # A program may exit (or be killed) without reading all of its stdin.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        writer.write(data)
        await writer.drain()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        writer.close()


async def terminate(proc: JailProcess, kill: Kill) -> None:
    """Kill the sandbox with nsjail spared, so nsjail reaps its child, logs how
    it ended and exits (leaving no zombie to the host's init); then anything."""
    if proc.returncode is None:
        await kill(frozenset({proc.pid}))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(GRACE_S):
                await proc.wait()
    if proc.returncode is None:
        await kill(frozenset())
    await proc.wait()


async def supervise(
    proc: JailProcess,
    *,
    stdin: bytes,
    output_limit: int,
    timeout_s: float,
    kill: Kill,
    stop: asyncio.Event | None = None,
    on_output: OutputSink | None = None,
    deliver: Callable[[], Coroutine[Any, Any, None] | None] | None = None,
) -> ProcessOutcome:
    """Hand the code over (`deliver`, as the deadline starts), feed stdin (then
    close it) and collect output until the process is done.

    `kill(spare)` must kill everything the process started except the pids in
    `spare`; it is used on the deadline, at the output cap, when `stop` is set
    and when this coroutine is cancelled.
    """
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    started = time.monotonic()
    capture = _Capture(output_limit)
    out, err = bytearray(), bytearray()
    out_task = asyncio.ensure_future(capture.pump(proc.stdout, out, "stdout", on_output))
    err_task = asyncio.ensure_future(capture.pump(proc.stderr, err, "stderr", on_output))
    feed_task = asyncio.ensure_future(_feed(proc.stdin, stdin))

    async def finish() -> None:
        await asyncio.gather(out_task, err_task)
        await proc.wait()

    finished = asyncio.ensure_future(finish())
    watched = {finished, asyncio.ensure_future(capture.hit.wait())}
    if stop is not None:
        watched.add(asyncio.ensure_future(stop.wait()))
    deadline_hit = False
    feed_code: asyncio.Future[None] | None = None
    try:
        if deliver is not None:
            # A rename and a pipe write on tmpfs (no waiting); a rest, if any,
            # is written as the interpreter reads it.
            rest = deliver()
            if rest is not None:
                feed_code = asyncio.ensure_future(rest)
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        except TimeoutError:
            deadline_hit = True
        if not finished.done():
            await terminate(proc, kill)
        # Every writer of the pipes is dead now, so EOF is near; bounded anyway.
        async with asyncio.timeout(SETTLE_TIMEOUT_S):
            await finished
        duration_ms = int((time.monotonic() - started) * 1000)
    finally:
        if proc.returncode is None:
            # Cancelled, or the kill failed: nothing may outlive the request.
            with contextlib.suppress(Exception):
                await asyncio.shield(terminate(proc, kill))
        for task in (*watched, out_task, err_task, feed_task, feed_code):
            if task is not None and not task.done():
                task.cancel()
    assert proc.returncode is not None
    return ProcessOutcome(
        returncode=proc.returncode,
        stdout=bytes(out),
        stderr=bytes(err),
        truncated_stdout=out_task.result(),
        truncated_stderr=err_task.result(),
        output_limit_hit=capture.hit.is_set(),
        deadline_hit=deadline_hit and not capture.hit.is_set(),
        stopped=stop is not None and stop.is_set() and not capture.hit.is_set(),
        duration_ms=duration_ms,
    )
