"""deploy/docker/runsc-capture: only `create` (which starts the Sentry) is given a
debug log of the container's own, in a root-only directory; every other runsc
command passes through untouched. The next runtime is a stand-in that prints its
arguments."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CAPTURE = REPO / "deploy" / "docker" / "runsc-capture"
EGRESS_CAPTURE = REPO / "deploy" / "docker" / "runsc-egress-capture"


def call(tmp_path: Path, *args: str, wrapper: Path = CAPTURE) -> list[str]:
    echo = tmp_path / "next"
    echo.write_text('#!/bin/sh\nfor a; do printf "%s\\n" "$a"; done\n')
    echo.chmod(0o755)
    env = {
        **os.environ,
        "EXECGATE_CAPTURE_NEXT": str(echo),
        "EXECGATE_GVISOR_TRACE_DIR": str(tmp_path / "traces"),
    }
    done = subprocess.run(
        [str(wrapper), *args], env=env, capture_output=True, text=True, check=True, timeout=10
    )
    return done.stdout.splitlines()


def test_create_gets_a_log_of_its_own(tmp_path: Path) -> None:
    cid = "a" * 64
    argv = ["--root", "/r", "--oci-seccomp", "create", "--bundle", "/b", cid]
    got = call(tmp_path, *argv)
    traces = tmp_path / "traces"
    assert got == [
        f"--debug-log={traces}/{cid}/",
        "--debug-command=boot",
        "--debug-log-format=json",
        *argv,
    ]
    assert traces.stat().st_mode & 0o777 == 0o700


def test_other_commands_pass_through(tmp_path: Path) -> None:
    for argv in (["--root", "/r", "start", "c1"], ["kill", "c1", "9"], ["delete", "c1"]):
        assert call(tmp_path, *argv) == argv
    assert not (tmp_path / "traces").exists()


def test_the_egress_variant_runs_runsc_egress(tmp_path: Path) -> None:
    text = EGRESS_CAPTURE.read_text()
    assert "EXECGATE_CAPTURE_NEXT=runsc-egress" in text
    assert os.access(EGRESS_CAPTURE, os.X_OK) and os.access(CAPTURE, os.X_OK)
