"""deploy/docker/runsc-safe: runsc's `delete` kills no process that merely reuses
the pid of a sandbox or gofer that is already gone, and still kills one that is not.

runsc 2022-12 SIGKILLs the pids it recorded at create without checking them; the
engine deletes a container after it has exited, so on a busy host the pid may by
then be a new process (another sandbox being started: "cannot start a stopped
process"). Each case runs in a private pid namespace (tests/deploy/runsc_pid_reuse.py
places innocent processes on the recorded pids there), so nothing on the host is hit.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.components import missing_component

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SAFE = REPO / "deploy" / "docker" / "runsc-safe"
HARNESS = Path(__file__).with_name("runsc_pid_reuse.py")


def reuse(delete_with: str, mode: str) -> dict[str, Any]:
    if os.geteuid() != 0:
        missing_component("runsc needs root")
    if not Path("/usr/bin/runsc").exists():
        missing_component("runsc is not installed (apt-get install runsc)")
    workdir = Path(tempfile.mkdtemp(prefix="execgate-runsc-"))
    try:
        done = subprocess.run(
            ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, str(HARNESS),
             str(workdir), delete_with, mode],
            capture_output=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr.decode(errors="replace")[-2000:]
        return dict(json.loads(done.stdout.decode().splitlines()[-1]))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def test_plain_runsc_delete_kills_whoever_reuses_the_recorded_pids() -> None:
    # The trap itself (this runsc build): if a newer one stops doing it, the
    # wrapper may go.
    report = reuse("/usr/bin/runsc", "dead")
    assert report["innocents_on_recorded_pids"] == sorted(report["recorded"]), report
    assert report["innocents_killed"], report


def test_runsc_safe_delete_spares_processes_on_stale_pids() -> None:
    report = reuse(str(SAFE), "dead")
    assert report["innocents_on_recorded_pids"] == sorted(report["recorded"]), report
    assert report["innocents_killed"] == [], report
    assert report["delete_rc"] == 0 and report["state_left"] == [], report


def test_runsc_safe_forced_delete_still_kills_a_running_sandbox() -> None:
    report = reuse(str(SAFE), "running")
    assert report["recorded"], report
    assert report["runsc_left"] == [], report
    assert report["delete_rc"] == 0 and report["state_left"] == [], report
