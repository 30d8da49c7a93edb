"""`idle_child` finds a jail's init once it waits for its code, and only then.

Real processes stand in for a jail: a parent (nsjail's place) whose first child
blocks opening a FIFO (an interpreter started ahead) or reading a pipe (the
launcher); and the neighbours that must not pass: a child still running, a
child not yet its own program, a parent gone, a child that never waits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from backends.capture.host import IDLE_LOOK_MAX_S, IDLE_LOOK_S, idle_child, wait_idle

Procs = list[subprocess.Popen[bytes]]


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        # Each is a session (and process group) of its own: its children go with it
        # (a `cat` left blocked on its FIFO would outlive the test).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def start(procs: list[subprocess.Popen[bytes]], script: str) -> subprocess.Popen[bytes]:
    # "; true": the shell forks its command (it would exec a last one in place).
    proc = subprocess.Popen(["/bin/sh", "-c", f"{script}; true"], stdin=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    procs.append(proc)
    return proc


def test_a_child_blocked_opening_a_fifo(tmp_path: Path, procs: Procs) -> None:
    fifo = tmp_path / "main.py"
    os.mkfifo(fifo)
    proc = start(procs, f"cat {fifo}")
    child = idle_child(proc.pid, 10.0)
    assert os.path.basename(os.readlink(f"/proc/{child}/exe")) == "cat"
    assert Path(f"/proc/{child}/wchan").read_text() == "wait_for_partner"


def test_a_child_blocked_reading_a_pipe(procs: Procs) -> None:
    proc = start(procs, "head -c1")
    child = idle_child(proc.pid, 10.0)
    assert os.path.basename(os.readlink(f"/proc/{child}/exe")) == "head"


def test_a_child_still_starting_is_waited_for(tmp_path: Path, procs: Procs) -> None:
    fifo = tmp_path / "main.py"
    os.mkfifo(fifo)
    # Busy for a while (its start-up), then waits on the FIFO.
    busy = "i=0; while [ $i -lt 40000 ]; do i=$((i+1)); done"
    proc = start(procs, f"sh -c '{busy}; exec cat {fifo}'")
    child = idle_child(proc.pid, 30.0)
    # Not taken while the loop ran (it was still the shell then, and running).
    assert os.path.basename(os.readlink(f"/proc/{child}/exe")) == "cat"
    assert Path(f"/proc/{child}/wchan").read_text() == "wait_for_partner"


def test_the_looks_at_a_child_still_starting_back_off(tmp_path: Path, procs: Procs) -> None:
    """Each look takes the GIL from the executions: a sandbox slow to start is not
    looked at every millisecond, and one nearly there is still found at once."""
    fifo = tmp_path / "main.py"
    os.mkfifo(fifo)
    proc = start(procs, f"sh -c 'sleep 0.4; exec cat {fifo}'")
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        time.sleep(seconds)

    child = idle_child(proc.pid, 10.0, sleep=sleep)
    assert os.path.basename(os.readlink(f"/proc/{child}/exe")) == "cat"
    assert pauses[0] == IDLE_LOOK_S and max(pauses) == IDLE_LOOK_MAX_S
    assert pauses == sorted(pauses)  # never shorter again
    # Looking every IDLE_LOOK_S would have taken ~400 looks.
    assert len(pauses) < 0.4 / IDLE_LOOK_MAX_S * 1.5


def test_a_child_that_is_not_yet_its_own_program_is_not_taken(procs: Procs) -> None:
    # The child is a fork of the parent (same program), blocked reading: a jail
    # still setting up looks like this. Never taken: the look runs out of time.
    code = "import os, sys; pid = os.fork(); os.read(0, 1) if pid == 0 else os.waitpid(pid, 0)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            start_new_session=True)  # fmt: skip
    procs.append(proc)
    with pytest.raises(OSError, match="is not waiting after 1 s"):
        idle_child(proc.pid, 1.0)


def test_a_jail_that_exits_first(procs: Procs) -> None:
    proc = start(procs, "exit 3")
    proc.wait()
    with pytest.raises(OSError, match="exited before its code was handed over"):
        idle_child(proc.pid, 10.0)


def test_a_jail_that_exits_while_looked_at(procs: Procs) -> None:
    proc = start(procs, "sleep 0.2")
    with pytest.raises(OSError, match="exited before its code was handed over"):
        idle_child(proc.pid, 10.0)


def test_a_child_that_never_waits_runs_out_of_time(procs: Procs) -> None:
    proc = start(procs, "sleep 30")
    with pytest.raises(OSError, match=r"is not waiting after 1 s \(init \d+: .*sleep"):
        idle_child(proc.pid, 1.0)


async def test_the_event_loop_looks_too(tmp_path: Path, procs: Procs) -> None:
    """wait_idle (priming a pooled sandbox from the loop) finds what idle_child
    finds, and stops looking once someone else looks (a claim took the sandbox)."""
    fifo = tmp_path / "main.py"
    os.mkfifo(fifo)
    proc = start(procs, f"sh -c 'sleep 0.2; exec cat {fifo}'")
    child = await wait_idle(proc.pid, 10.0)
    assert os.path.basename(os.readlink(f"/proc/{child}/exe")) == "cat"
    never = start(procs, "sleep 30")
    looks = 0

    def claimed() -> bool:
        nonlocal looks
        looks += 1
        return looks > 3

    assert await wait_idle(never.pid, 10.0, until=claimed) == 0
    gone = start(procs, "exit 3")
    gone.wait()
    with pytest.raises(OSError, match="exited before its code was handed over"):
        await wait_idle(gone.pid, 10.0)
