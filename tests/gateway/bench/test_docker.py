"""The docker rows of `execgate bench`, as printed (shape only, no timing)."""

from __future__ import annotations

from gateway.bench.docker import render_docker
from tests.gateway.bench.test_ratios import docker_runtime, p50


def test_the_docker_block_prints_the_alternated_blocks_with_their_rounds() -> None:
    runc = {
        **docker_runtime(21.0, 7.0),
        "cli_run_rm": p50(300.0),
        "backend_pooled": p50(30.0),
        "pooled_vs_cli_p50": 10.0,
    }
    runc["beside_cli_c4"]["backend_pooled"]["rounds"] = [20.5, 21.0, 22.25]
    text = "\n".join(render_docker({"runc": runc, "runsc": {"skipped": "no runsc"}}))
    assert "runc cli_run_rm, blocks" in text
    assert "runc backend_pooled, blocks" in text and "(rounds: 20.5, 21, 22.25)" in text
    assert "runsc: skipped: no runsc" in text
    # A results file from before the blocks prints the rest as before.
    del runc["beside_cli_c4"]
    assert "blocks" not in "\n".join(render_docker({"runc": runc}))
