"""`execgate escape-test`: the table, the JSON, the exit status."""

from __future__ import annotations

import json

from gateway.escape.catalog import techniques
from gateway.settings import Settings
from tests.gateway.test_cli import cli_env, run_cli


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
