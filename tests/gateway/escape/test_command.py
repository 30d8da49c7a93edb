"""`execgate escape-test`: the table, the JSON, the exit status."""

from __future__ import annotations

import asyncio
import json
import os
import pty

from gateway.escape.catalog.index import techniques
from gateway.settings.model import Settings
from tests.gateway.test_cli import EXECGATE, cli_env, run_cli


async def test_a_backend_that_runs_nothing_proves_nothing(settings: Settings) -> None:
    # The noop backend runs no probe at all: every technique is an error of the
    # suite (the probe never started), never "contained", and the run fails.
    env = cli_env(settings)
    code, out, err = await run_cli("escape-test", "--backend", "noop", "--json", env=env)
    assert code == 1, err
    report = json.loads(out)
    assert report["backend"] == "noop" and report["sound"] is False
    assert report["counts"] == {
        "contained": 0,
        "escaped": 0,
        "not_applicable": 0,
        "error": len(techniques()),
    }
    assert {t["detail"].split(";")[0] for t in report["techniques"]} == {
        "the probe did not run (no start line"
    }
    code, out, err = await run_cli("escape-test", "--backend", "noop", env=env)
    assert code == 1, err
    assert out.splitlines()[0].split()[:2] == ["technique", "what"]
    assert "escape-test noop:" in out.splitlines()[-1] and "NOT SOUND" in out.splitlines()[-1]


async def _on_a_terminal(env: dict[str, str], *args: str) -> tuple[bytes, str]:
    """Run the CLI with a pty as its stderr: (stdout, what the terminal showed)."""
    master, slave = pty.openpty()
    try:
        proc = await asyncio.create_subprocess_exec(
            *EXECGATE, *args, env=env, stdout=asyncio.subprocess.PIPE, stderr=slave
        )
        os.close(slave)
        slave = -1
        out, _ = await asyncio.wait_for(proc.communicate(), 120)
        seen = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the other side is closed and drained
                break
            if not chunk:
                break
            seen += chunk
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)
    return out, seen.decode()


async def test_progress_on_a_terminal_only(settings: Settings) -> None:
    env = cli_env(settings)
    total = len(techniques())
    # Not a terminal: the table on stdout, nothing but the summary on stderr.
    _, _, err = await run_cli("escape-test", "--backend", "noop", env=env)
    assert f"/{total}]" not in err
    # On a terminal: techniques done of total as they finish.
    out, shown = await _on_a_terminal(env, "escape-test", "--backend", "noop")
    assert f"[1/{total}]" in shown and f"[{total}/{total}]" in shown
    assert b"technique" in out  # the table itself still goes to stdout
    # --json on a terminal: quiet.
    out, shown = await _on_a_terminal(env, "escape-test", "--backend", "noop", "--json")
    assert f"/{total}]" not in shown and json.loads(out)["backend"] == "noop"
