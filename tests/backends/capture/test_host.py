"""The demultiplexer with the tracer's lines written by hand, and capture settings.

The lines are what bpftrace -f json prints; the real tracer is in test_host_tracer.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from backends.base import BackendError
from backends.capture.host import (
    BARRIER_TIMEOUT_S,
    Capture,
    Demux,
    HostCapture,
    HostTracer,
    TracerHub,
)
from backends.capture.record import BehaviourRecorder
from backends.capture.settings import CaptureSettings
from backends.egress.netns import enter, run_in_thread
from tests.backends.capture.test_markers import CpusGoAway
from tests.backends.conftest import require_root

NS, OTHER = 4026532001, 4026532002
NAMES = {165: "mount", 101: "ptrace"}


def printed(data: str) -> bytes:
    return json.dumps({"type": "printf", "data": data + "\n"}).encode()


def capture(ns: int = NS, since: int = 100, skip_pid: int = 0) -> Capture:
    return Capture(ns, BehaviourRecorder(tracer="bpftrace"), since, skip_pid)


def demux_with(*captures: Capture) -> Demux:
    demux = Demux(NAMES)
    for c in captures:
        demux.register(c)
    return demux


def test_events_reach_their_own_execution_only() -> None:
    mine, theirs = capture(NS), capture(OTHER)
    demux = demux_with(mine, theirs)
    demux.feed(printed(f"f {NS} 5 200 1 0 -2 /etc/shadow"))
    demux.feed(printed(f"f {OTHER} 5 200 1 0 -13 /root/.ssh/id_rsa"))
    demux.feed(printed(f"r {NS} 5 201 165 -1"))
    demux.feed(printed("f 4026532999 1 200 1 0 -2 /etc/unknown"))
    a, b = mine.recorder.finish(), theirs.recorder.finish()
    assert [(f.path, f.result) for f in a.files] == [("/etc/shadow", "ENOENT")]
    assert a.syscalls_refused == (("mount", 1),)
    assert [(f.path, f.result) for f in b.files] == [("/root/.ssh/id_rsa", "EACCES")]
    assert demux.discarded == 1


def test_a_forged_line_inside_a_path_stays_a_path() -> None:
    mine, theirs = capture(NS), capture(OTHER)
    demux = demux_with(mine, theirs)
    demux.feed(printed(f"f {NS} 5 200 1 0 -2 /tmp/x\nf {OTHER} 1 300 1 0 -2 /etc/forged"))
    assert theirs.recorder.finish().empty
    assert mine.recorder.finish().files[0].path == f"/tmp/x\nf {OTHER} 1 300 1 0 -2 /etc/forged"


def test_before_the_claim_and_the_launcher_are_not_the_executions() -> None:
    mine = capture(since=1_000, skip_pid=1)
    demux = demux_with(mine)
    demux.feed(printed(f"f {NS} 7 999 1 0 -2 /etc/while-pooled"))
    demux.feed(printed(f"f {NS} 1 2000 2 0 0 /code/main.py"))
    demux.feed(printed(f"f {NS} 7 2001 1 0 -2 /etc/after"))
    assert [f.path for f in mine.recorder.finish().files] == ["/etc/after"]


def test_exec_arguments_renames_and_signals_are_assembled() -> None:
    mine = capture()
    demux = demux_with(mine)
    for data in (
        f"x {NS} 9 300 /bin/sh",
        f"a {NS} 9 300 /bin/sh",
        f"a {NS} 8 300 interleaved",  # another process's exec: its own
        f"a {NS} 9 300 -c",
        f"a {NS} 9 300 id; echo pwned",
        f"X {NS} 9 301 0",
        f"x {NS} 10 302 /nope",
        f"X {NS} 10 303 -2",
        f"g {NS} 9 304 /workspace/b",
        f"f {NS} 9 304 4 0 0 /workspace/a",
        f"f {NS} 9 305 3 512 0 /workspace/d",  # unlinkat(AT_REMOVEDIR)
        f"s {NS} 9 306 1 1 9 0",
        f"s {NS} 9 306 4 1 16 -1",
    ):
        demux.feed(printed(data))
    b = mine.recorder.finish()
    assert [(p.path, p.argv, p.result) for p in b.programs] == [
        ("/bin/sh", ("/bin/sh", "-c", "id; echo pwned"), "ok"),
        ("/nope", (), "ENOENT"),
    ]
    assert {(f.op, f.path) for f in b.files} == {
        ("rename", "/workspace/a -> /workspace/b"),
        ("rmdir", "/workspace/d"),
    }
    assert {(s.syscall, s.target, s.signal, s.result) for s in b.signals} == {
        ("kill", 1, 9, "ok"),
        ("ptrace", 1, 16, "EPERM"),
    }


def test_counts_the_kernel_kept_and_lost_events_are_dropped() -> None:
    mine, theirs = capture(NS), capture(OTHER)
    demux = demux_with(mine, theirs)
    demux.feed(printed(f"z {NS} 1 400 70"))  # the sandbox's init exited
    demux.feed(json.dumps({"type": "lost_events", "data": {"events": 3}}).encode())
    assert mine.recorder.finish().dropped == 73
    assert theirs.recorder.finish().dropped == 3  # whose they were is unknown


def test_the_barrier_completes_once_every_cpu_reported() -> None:
    mine = capture()
    mine.waiting = {0, 1}
    demux = demux_with(mine)
    demux.feed(printed(f"b {NS} 0 500 5"))
    assert not mine.done.is_set()
    demux.feed(printed(f"b {NS} 1 501 0"))
    assert mine.done.is_set()
    assert mine.recorder.finish().dropped == 5


def test_a_barrier_line_the_record_does_not_wait_for_is_ignored() -> None:
    # A late line for the same number (its earlier holder's end timed out) must not
    # end a record that has not asked for its end, nor count the other's drops.
    mine = capture()
    demux = demux_with(mine)
    demux.feed(printed(f"b {NS} 0 500 7"))
    assert not mine.done.is_set()
    mine.waiting = {0, 1}
    demux.feed(printed(f"b {NS} 0 600 0"))
    demux.feed(printed(f"b {NS} 0 601 9"))  # a repeat of CPU 0: not the end
    assert not mine.done.is_set()
    demux.feed(printed(f"b {NS} 1 602 0"))
    assert mine.done.is_set()
    assert mine.recorder.finish().dropped == 0


def test_truncated_and_unreadable_paths_say_so() -> None:
    mine = capture()
    demux = demux_with(mine)
    long = "/etc/" + "x" * 194  # 199 bytes: bpftrace's limit
    demux.feed(printed(f"f {NS} 5 200 1 0 -2 {long}"))
    demux.feed(printed(f"f {NS} 5 200 1 0 -14 "))
    paths = [f.path for f in mine.recorder.finish().files]
    assert paths == [long + "…", "?"]


def test_an_unfinished_exec_is_kept_at_the_end() -> None:
    mine = capture()
    demux = demux_with(mine)
    demux.feed(printed(f"x {NS} 9 300 /bin/true"))
    demux.unregister(mine)
    assert [p.path for p in mine.recorder.finish().programs] == ["/bin/true"]
    assert NS not in demux.captures


async def test_disabled_capture_is_off_with_its_reason() -> None:
    host = HostCapture(CaptureSettings(enabled=False), "test")
    await host.start()
    assert host.status() == (False, "disabled in config")
    assert host.health_problem() == ""
    assert (await host.end(await host.begin(1, "python"))).reason == "disabled in config"


async def test_required_capture_that_cannot_start_fails_closed() -> None:
    settings = CaptureSettings(required=True, tracer_path="/nonexistent/bpftrace")
    host = HostCapture(settings, "test")
    with pytest.raises(BackendError, match="capture is required"):
        await host.start()
    on, why = host.status()
    assert not on and why
    assert "required" in host.health_problem()
    # Not required: the backend runs, and says why capture is off.
    host = HostCapture(CaptureSettings(tracer_path="/nonexistent/bpftrace"), "test")
    await host.start()
    on, why = host.status()
    assert not on and why and host.health_problem() == ""


def test_lookups_sockets_and_other_architectures_are_named() -> None:
    mine = capture()
    demux = Demux({272: "unshare"}, {310: "unshare"})
    demux.register(mine)
    for data in (
        f"f {NS} 5 200 7 0 -2 /etc/sudoers",
        f"f {NS} 5 201 8 0 -2 /var/run/docker.sock",
        # An abstract name: as long as the address said, not what followed it.
        f"f {NS} 5 202 8 {1 | (9 << 8)} -111 execgate-leftover-bytes",
        f"r {NS} 5 203 {0x40000000 | 272} -1",
        f"r {NS} 5 204 {0x100000 | 310} -1",
        f"r {NS} 5 205 {0x100000 | 999} -1",
    ):
        demux.feed(printed(data))
    b = mine.recorder.finish()
    assert [(f.op, f.path, f.result) for f in b.files] == [
        ("stat", "/etc/sudoers", "ENOENT"),
        ("connect", "/var/run/docker.sock", "ENOENT"),
        ("connect", "@execgate-", "ECONNREFUSED"),
    ]
    assert dict(b.syscalls_refused) == {"x32 unshare": 1, "i386 unshare": 1, "i386 syscall 999": 1}
    assert b.kinds() == {"lookups", "sockets", "syscalls"}


def test_sysv_keys_are_named_by_kind_and_key() -> None:
    mine = capture()
    demux = demux_with(mine)
    for data in (
        f"k {NS} 5 200 1 {0xC0DE} -2",
        f"k {NS} 5 201 2 -1 -13",  # key_t is an int: -1 is 0xffffffff
        f"k {NS} 5 202 3 {0xC0E0} 3",
        f"k {NS} 5 203 1 {0xC0DE} x",  # malformed: no record
    ):
        demux.feed(printed(data))
    b = mine.recorder.finish()
    assert [(f.op, f.path, f.result) for f in b.files] == [
        ("ipc", "shm:0x0000c0de", "ENOENT"),
        ("ipc", "msg:0xffffffff", "EACCES"),
        ("ipc", "sem:0x0000c0e0", "ok"),
    ]
    assert b.kinds() == {"ipc"}


class SlowTracer:
    """A tracer whose registration blocks until released (a loaded host)."""

    running, problem = True, ""

    def __init__(self) -> None:
        self.entered, self.release, self.forgot = (threading.Event() for _ in range(3))
        self.registered: list[Capture] = []
        self.discarded: list[Capture] = []

    def register(self, pid: int, recorder: BehaviourRecorder, skip_pid: int = 0) -> Capture:
        self.entered.set()
        self.release.wait(30)
        self.registered.append(Capture(NS, recorder, 0, skip_pid))
        return self.registered[-1]

    def discard(self, capture: Capture) -> None:
        self.discarded.append(capture)
        self.forgot.set()


@pytest.mark.asyncio
async def test_a_cancelled_claim_forgets_its_registration() -> None:
    # The request is cancelled while the thread registers: the registration still
    # happens, so it must be undone, or the kernel would print that namespace on.
    host = HostCapture(CaptureSettings(), "test")
    slow = SlowTracer()
    host.tracer = slow  # type: ignore[assignment]
    claim = asyncio.ensure_future(host.begin(4242, "python"))
    assert await asyncio.to_thread(slow.entered.wait, 30)
    claim.cancel()
    with pytest.raises(asyncio.CancelledError):
        await claim
    slow.release.set()
    assert await asyncio.to_thread(slow.forgot.wait, 30)
    assert slow.discarded == slow.registered and len(slow.registered) == 1


async def test_close_stops_the_readers_at_once_though_the_output_stays_open(
    tmp_path: Path,
) -> None:
    # bpftrace's output reaches EOF only when the kernel has released every one of
    # its tracepoints (~20 s after it is killed). Here a child of the stand-in keeps
    # the output open for good: close must not wait for the end of it, and must kill
    # the tracer.
    require_root()
    fake = tmp_path / "tracer"
    fake.write_text(
        "#!/bin/sh\n"
        f"sleep 600 & echo $! > {tmp_path / 'child'}\n"
        'echo \'{"type": "printf", "data": "ready\\n"}\'\n'
        "exec sleep 600\n"
    )
    fake.chmod(0o755)
    tracer = HostTracer(CaptureSettings(tracer_path=str(fake)))
    await tracer.start()
    proc, threads = tracer._proc, list(tracer._threads)
    assert proc is not None and tracer.running and all(t.is_alive() for t in threads)
    child = int((tmp_path / "child").read_text())
    try:
        await tracer.close()
        assert not any(t.is_alive() for t in threads)
        assert await asyncio.to_thread(proc.wait, 30) == -signal.SIGKILL
        assert tracer.problem == "stopped" and not tracer.running
        assert os.path.exists(f"/proc/{child}")  # the output was still open
    finally:
        os.kill(child, signal.SIGKILL)


async def test_a_cpu_the_barrier_cannot_mark_leaves_the_record_incomplete(
    tmp_path: Path,
) -> None:
    # Not waited for (the barrier would time out), and not passed off as complete:
    # that CPU's events are not proven read.
    require_root()
    fake = tmp_path / "tracer"
    fake.write_text('#!/bin/sh\necho \'{"type": "printf", "data": "ready\\n"}\'\nexec sleep 600\n')
    fake.chmod(0o755)
    tracer = HostTracer(CaptureSettings(tracer_path=str(fake)), markers=CpusGoAway)
    await tracer.start()
    try:
        assert tracer.running and tracer.markers.cpus
        mine = capture()
        tracer.demux.register(mine)
        async with asyncio.timeout(BARRIER_TIMEOUT_S / 2):
            behaviour = await tracer.finish(mine)
        cpus = ", ".join(map(str, sorted(tracer.markers.cpus)))
        assert behaviour.reason == f"incomplete: CPU {cpus} could not be marked", behaviour
        assert tracer.demux.captures == {}
    finally:
        await tracer.close()
    assert not tracer.markers.threads


async def test_a_dead_tracer_is_closed_when_the_hub_replaces_it(tmp_path: Path) -> None:
    require_root()
    fake = tmp_path / "tracer"
    fake.write_text('#!/bin/sh\necho \'{"type": "printf", "data": "ready\\n"}\'\nexec sleep 600\n')
    fake.chmod(0o755)
    settings = CaptureSettings(tracer_path=str(fake))
    hub = TracerHub()
    try:
        first = await hub.acquire(settings)
        assert first._proc is not None
        first._proc.kill()  # the tracer dies under the gateway
        await asyncio.to_thread(first._proc.wait)
        threads = list(first._threads)
        await asyncio.to_thread(lambda: [t.join(10) for t in threads])
        assert not first.running and "exited" in first.problem
        second = await hub.acquire(settings)
        assert second is not first and second.running
        # The dead one's threads, pipes and descriptors went with it.
        assert first.problem == "stopped" and first._stop_w == -1 and first._proc is None
    finally:
        await hub.close()


def _sandbox_in_its_own_pid_namespace() -> tuple[subprocess.Popen[bytes], int]:
    """`unshare --pid --fork sleep`: (the unshare process, the pid of its child,
    init of a new pid namespace)."""
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "sleep", "60"], stderr=subprocess.DEVNULL
    )
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
    deadline = time.monotonic() + 10
    while not (found := children.read_text().split()):
        assert time.monotonic() < deadline, "unshare's child did not appear"
        time.sleep(0.01)
    return proc, int(found[0])


def _new_namespace_numbers(count: int) -> list[int]:
    """The numbers of `count` new (network) namespaces, all alive at once: every
    kind of namespace draws its number from one allocator; closed before returning."""

    def make() -> list[int]:
        fds = []
        try:
            for _ in range(count):
                fd = enter(None)
                assert fd is not None
                fds.append(fd)
            return [os.fstat(fd).st_ino for fd in fds]
        finally:
            for fd in fds:
                os.close(fd)

    return run_in_thread(make)


@pytest.mark.parametrize("end", ["finish", "discard"])
async def test_a_registered_namespace_keeps_its_number_until_its_end(end: str) -> None:
    """The kernel hands a freed namespace's number to the next one made; while an
    execution's record is open (its sandbox already dead), no new sandbox may get
    it, or the tracer's lines (and its barrier) would go to the wrong record."""
    require_root()
    tracer = HostTracer(CaptureSettings())
    proc, init = _sandbox_in_its_own_pid_namespace()
    try:
        capture = tracer.register(init, BehaviourRecorder(tracer="bpftrace"))
        held = capture.held
    finally:
        os.kill(init, signal.SIGKILL)  # its init gone, the namespace goes (unshare reaps it)
        proc.wait(timeout=10)
    assert capture.held >= 0
    deadline = time.monotonic() + 10
    while Path(f"/proc/{init}").exists():  # the sandbox is gone: its namespace freed
        assert time.monotonic() < deadline
        time.sleep(0.01)
    # A freed number comes back after an RCU grace period (~20 ms here): ask for new
    # namespaces for a while, as a pool refilling would.
    for _ in range(40):
        assert capture.ns not in _new_namespace_numbers(4)
        time.sleep(0.025)
    if end == "finish":
        await tracer.finish(capture)
    else:
        tracer.discard(capture)
    assert capture.held == -1 and tracer.demux.captures == {}
    assert (
        not os.path.exists(f"/proc/self/fd/{held}")
        or os.readlink(f"/proc/self/fd/{held}") != f"pid:[{capture.ns}]"
    )
