"""The ratios block of `execgate bench`: every goal of issue 18, from one run's results.

Shape only (no timing thresholds): each figure is computed from the two measurements
it compares, a missing or skipped measurement is reported as not measured (never as
met), and the block and the JSON rows carry the figure, the goal and the verdict.
"""

from __future__ import annotations

from typing import Any

from gateway.bench.ratios import GOALS, evaluate, render


def p50(ms: float) -> dict[str, float]:
    return {"n": 10, "p50_ms": ms, "p95_ms": ms, "p99_ms": ms}


def rate(per_s: float, concurrency: int = 4) -> dict[str, Any]:
    return {"concurrency": concurrency, "per_s": per_s, **p50(1.0)}


def docker_runtime(pooled: float, cli: float) -> dict[str, Any]:
    return {
        "backend_pooled_throughput": [rate(1.0, 1), rate(pooled)],
        "backend_burst_throughput": [rate(pooled * 2)],
        "cli_run_rm_throughput": [rate(1.0, 1), rate(cli)],
    }


def in_turns(gateway_ms: float, bare_ms: float, blocks_ms: float = 99.0) -> dict[str, Any]:
    # The block figure (`blocks_ms`) is printed, not used: (a) and (d) are the turns'.
    return {**p50(blocks_ms), "beside_bare": {"bare": p50(bare_ms), "gateway": p50(gateway_ms)}}


def full_results() -> dict[str, Any]:
    return {
        "bare_python": p50(10.0),
        "bare_python_throughput": [rate(50.0, 1), rate(100.0)],
        "gateway_nsjail": in_turns(15.0, 10.0),
        "gateway_nsjail_throughput": [rate(30.0, 1), rate(60.0), rate(55.0, 16)],
        "gateway_noop": p50(3.5),
        "gateway_healthz": p50(3.0),
        "gateway_gvisor": in_turns(25.0, 10.0),
        "policy_embedded": p50(0.08),
        "gateway_nsjail_capture_on": p50(15.6),
        "gateway_nsjail_capture_off": p50(15.0),
        "gateway_gvisor_capture_on": p50(30.0),
        "gateway_gvisor_capture_off": p50(25.0),
        "docker": {"runc": docker_runtime(21.0, 7.0), "runsc": docker_runtime(4.0, 2.0)},
    }


def test_every_goal_of_the_issue_has_a_row_computed_from_its_two_measurements() -> None:
    rows = {row["key"]: row for row in evaluate(full_results())}
    assert len(rows) == len(GOALS) == 11
    assert rows["capture_on_vs_off_nsjail_p50"]["value"] == 1.04
    assert rows["capture_on_vs_off_nsjail_p50"]["met"] is True  # goal <= 1.05x
    assert rows["capture_on_vs_off_gvisor_p50"]["value"] == 1.2
    assert rows["capture_on_vs_off_gvisor_p50"]["met"] is False
    assert rows["gateway_nsjail_vs_bare_p50"]["value"] == 1.5
    assert rows["gateway_nsjail_vs_bare_p50"]["met"] is False  # goal <= 1.0x
    assert rows["gateway_nsjail_vs_bare_c4"]["value"] == 0.6
    assert rows["gateway_nsjail_vs_bare_c4"]["met"] is True  # goal >= 0.5x
    assert rows["noop_minus_healthz_p50_ms"]["value"] == 0.5
    assert rows["gateway_gvisor_vs_bare_p50"]["value"] == 2.5
    assert rows["policy_embedded_p50_us"]["value"] == 80.0
    assert rows["policy_embedded_p50_us"]["met"] is True
    assert rows["docker_pooled_vs_cli_c4_runc"]["value"] == 3.0
    assert rows["docker_pooled_vs_cli_c4_runc"]["met"] is True  # >= is met at the goal
    assert rows["docker_pooled_vs_cli_c4_runsc"]["value"] == 2.0
    assert rows["docker_pooled_vs_cli_c4_runsc"]["met"] is False
    assert rows["docker_burst_vs_cli_c4_runc"]["value"] == 6.0
    assert rows["docker_burst_vs_cli_c4_runsc"]["value"] == 4.0
    for row in rows.values():
        assert row["goal"].startswith(("<= ", ">= ")) and row["label"] and row["unit"]


def test_the_verdict_is_the_figures_not_its_roundings() -> None:
    # 63.8 / 128.3 = 0.4973: shown as 0.497x, and below the >= 0.5x goal.
    results = full_results()
    results["gateway_nsjail_throughput"] = [rate(63.8)]
    results["bare_python_throughput"] = [rate(128.3)]
    results["gateway_nsjail"] = in_turns(10.004, 10.0)  # a hair over the <= 1x goal
    rows = {row["key"]: row for row in evaluate(results)}
    assert rows["gateway_nsjail_vs_bare_c4"]["value"] == 0.497
    assert rows["gateway_nsjail_vs_bare_c4"]["met"] is False
    assert rows["gateway_nsjail_vs_bare_p50"]["value"] == 1.0
    assert rows["gateway_nsjail_vs_bare_p50"]["met"] is False
    assert any("0.497x" in line and line.endswith("missed") for line in render(list(rows.values())))


def test_a_missing_or_skipped_measurement_is_not_measured_never_met() -> None:
    results = full_results()
    del results["gateway_healthz"]
    results["gateway_gvisor"] = {"skipped": "BackendError: no runsc"}
    results["gateway_nsjail"] = p50(15.0)  # a results file from before the turns
    results["docker"] = {"runc": {"skipped": "no image"}, "runsc": docker_runtime(4.0, 0.0)}
    rows = {row["key"]: row for row in evaluate(results)}
    for key, why in (
        ("noop_minus_healthz_p50_ms", "gateway_healthz not measured"),
        ("gateway_gvisor_vs_bare_p50", "no runsc"),
        ("gateway_nsjail_vs_bare_p50", "in turns with the bare floor not measured"),
        ("docker_pooled_vs_cli_c4_runc", "no image"),
        ("docker_pooled_vs_cli_c4_runsc", "division by zero"),
        ("docker_burst_vs_cli_c4_runc", "no image"),
    ):
        assert rows[key]["value"] is None and rows[key]["met"] is None
        assert why in rows[key]["why"]
    no_docker = evaluate({**results, "docker": {"skipped": "no docker CLI on PATH"}})
    assert all("no docker CLI" in r["why"] for r in no_docker if r["key"].startswith("docker"))


def test_the_block_prints_each_figure_its_goal_and_the_verdict() -> None:
    results = full_results()
    del results["gateway_gvisor"]
    lines = render(evaluate(results))
    body = [line for line in lines if line.startswith("  ")]
    assert len(body) == len(GOALS)
    assert any("1.5x" in line and "goal <= 1x" in line and line.endswith("missed") for line in body)
    assert any("80us" in line and line.endswith("met") for line in body)
    assert any("not measured: gateway_gvisor not measured" in line for line in body)
