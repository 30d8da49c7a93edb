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
    # The rows taken apart are printed; (f) sustained is the alternated blocks'.
    return {
        "backend_pooled_throughput": [rate(1.0, 1), rate(pooled * 1.5)],
        "backend_burst_throughput": [rate(pooled * 2)],
        "cli_run_rm_throughput": [rate(1.0, 1), rate(cli)],
        "beside_cli_c4": {
            "cli_run_rm": {**rate(cli), "rounds": [cli] * 3},
            "backend_pooled": {**rate(pooled), "rounds": [pooled] * 3},
        },
    }


def in_turns(gateway_ms: float, bare_ms: float, blocks_ms: float = 99.0) -> dict[str, Any]:
    # The block figure (`blocks_ms`) is printed, not used: (a) and (d) are the turns'.
    return {**p50(blocks_ms), "beside_bare": {"bare": p50(bare_ms), "gateway": p50(gateway_ms)}}


def alternated(gateway_per_s: float, bare_per_s: float) -> dict[str, Any]:
    return {
        "bare": {**rate(bare_per_s), "rounds": [bare_per_s] * 3},
        "gateway": {**rate(gateway_per_s), "rounds": [gateway_per_s] * 3},
    }


def full_results() -> dict[str, Any]:
    return {
        "bare_python": p50(10.0),
        # The rows taken minutes apart are printed; (b) is the alternated blocks'.
        "bare_python_throughput": [rate(50.0, 1), rate(99.0)],
        "gateway_nsjail": {**in_turns(15.0, 10.0), "beside_bare_c4": alternated(60.0, 100.0)},
        "gateway_nsjail_throughput": [rate(30.0, 1), rate(66.0), rate(55.0, 16)],
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
    results["gateway_nsjail"] = {
        **in_turns(10.004, 10.0),  # a hair over the <= 1x goal
        "beside_bare_c4": alternated(63.8, 128.3),
    }
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


def test_b_comes_from_the_alternated_blocks_and_older_files_from_the_two_rows() -> None:
    results = full_results()
    rows = {row["key"]: row for row in evaluate(results)}
    assert rows["gateway_nsjail_vs_bare_c4"]["value"] == 0.6  # 60 / 100, not 66 / 99
    # A results file from before the alternated blocks: the rows taken apart.
    del results["gateway_nsjail"]["beside_bare_c4"]
    rows = {row["key"]: row for row in evaluate(results)}
    assert rows["gateway_nsjail_vs_bare_c4"]["value"] == round(66 / 99, 3)
    # A side missing from the blocks is not measured, never met.
    results["gateway_nsjail"]["beside_bare_c4"] = {"bare": {"skipped": "no python3"}}
    row = {r["key"]: r for r in evaluate(results)}["gateway_nsjail_vs_bare_c4"]
    assert row["met"] is None and "not measured" in row["why"]


def test_f_sustained_comes_from_the_alternated_blocks_and_the_burst_from_its_row() -> None:
    results = full_results()
    rows = {row["key"]: row for row in evaluate(results)}
    assert rows["docker_pooled_vs_cli_c4_runc"]["value"] == 3.0  # 21 / 7, not 31.5 / 7
    assert rows["docker_burst_vs_cli_c4_runc"]["value"] == 6.0  # 42 / 7: the rows
    # A results file from before the alternated blocks: the rows taken apart.
    del results["docker"]["runc"]["beside_cli_c4"]
    rows = {row["key"]: row for row in evaluate(results)}
    assert rows["docker_pooled_vs_cli_c4_runc"]["value"] == 4.5
