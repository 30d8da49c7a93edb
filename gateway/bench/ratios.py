"""The figures issue 18 sets goals for, each computed from one `execgate bench` run.

Every figure compares two measurements of the same run on the same machine (the
bare-host floor included), so a busy machine moves both sides. Where the two are
single requests (print(1) against the bare floor, capture on against off) they are
taken in turns, and throughput in alternating blocks, so that both sides share every
stretch of the run. A figure whose
measurements are missing (no docker engine, a runtime that could not start) is
reported as not measured, saying why, never as met.

To add a row: measure into `results` in gateway/bench/run.py (for the same
gateway with one setting changed, `run.gateway_print`), then add a `Goal` here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Goal:
    key: str  # stable name in the JSON
    label: str
    unit: str  # "x" (a ratio) or "ms" / "us" (a difference or a time)
    goal: float
    at_most: bool  # met when the figure is <= goal (else >= goal)
    # The figure from the results, or a string saying why it was not measured.
    figure: Callable[[dict[str, Any]], float | str]  # a Figure


def _p50(results: dict[str, Any], key: str) -> float | str:
    found = results.get(key)
    if not isinstance(found, dict):
        return f"{key} not measured"
    if "skipped" in found:
        return f"{key}: {found['skipped']}"[:200]
    return float(found["p50_ms"])


def _per_s(results: dict[str, Any], key: str, concurrency: int) -> float | str:
    rows = results.get(key)
    if isinstance(rows, dict):  # one row (alternated blocks), or why it is missing
        if "skipped" in rows:
            return f"{key}: {rows['skipped']}"[:200]
        rows = [rows]
    for row in rows or ():
        if row["concurrency"] == concurrency:
            return float(row["per_s"])
    return f"{key} at concurrency {concurrency} not measured"


def _ratio(a: float | str, b: float | str) -> float | str:
    if isinstance(a, str):
        return a
    if isinstance(b, str):
        return b
    return a / b if b else "division by zero"


def _minus(a: float | str, b: float | str) -> float | str:
    if isinstance(a, str):
        return a
    if isinstance(b, str):
        return b
    return a - b


def _in_us(ms: float | str) -> float | str:
    return ms if isinstance(ms, str) else ms * 1000


Figure = Callable[[dict[str, Any]], float | str]
DECIMALS = 3  # as printed and written; the verdict uses the unrounded figure


def _docker(runtime: str, pooled: str = "backend_pooled") -> Figure:
    def figure(results: dict[str, Any]) -> float | str:
        docker = results.get("docker") or {"skipped": "docker not measured"}
        if "skipped" in docker:
            return f"docker: {docker['skipped']}"[:200]
        one = docker.get(runtime) or {"skipped": "not measured"}
        if "skipped" in one:
            return f"{runtime}: {one['skipped']}"[:200]
        blocks = one.get("beside_cli_c4")
        if pooled == "backend_pooled" and isinstance(blocks, dict):
            # Sustained: the two in alternating blocks (docker.py); a results file
            # from before them, or the burst: the rows taken apart.
            return _ratio(_per_s(blocks, pooled, 4), _per_s(blocks, "cli_run_rm", 4))
        return _ratio(
            _per_s(one, f"{pooled}_throughput", 4), _per_s(one, "cli_run_rm_throughput", 4)
        )

    return figure


def _beside_bare(key: str) -> Figure:
    """print(1) through a gateway / the bare floor, both taken in turns in one run
    (run.beside_bare)."""

    def figure(results: dict[str, Any]) -> float | str:
        row = results.get(key)
        if not isinstance(row, dict):
            return f"{key} not measured"
        if "skipped" in row:
            return f"{key}: {row['skipped']}"[:200]
        turns = row.get("beside_bare")
        if not isinstance(turns, dict):
            return f"{key} in turns with the bare floor not measured"
        return _ratio(_p50(turns, "gateway"), _p50(turns, "bare"))

    return figure


def _c4_beside_bare(results: dict[str, Any]) -> float | str:
    """(b): executions per second at concurrency 4 through the gateway on nsjail / of
    the bare floor, from their alternating blocks (run.beside_bare_throughput); a
    results file from before them: the two rows taken minutes apart."""
    row = results.get("gateway_nsjail")
    blocks = row.get("beside_bare_c4") if isinstance(row, dict) else None
    if not isinstance(blocks, dict):
        return _ratio(
            _per_s(results, "gateway_nsjail_throughput", 4),
            _per_s(results, "bare_python_throughput", 4),
        )
    return _ratio(_per_s(blocks, "gateway", 4), _per_s(blocks, "bare", 4))


def _capture(name: str) -> Figure:
    def figure(results: dict[str, Any]) -> float | str:
        on = _p50(results, f"gateway_{name}_capture_on")
        return _ratio(on, _p50(results, f"gateway_{name}_capture_off"))

    return figure


GOALS: tuple[Goal, ...] = (
    Goal(
        "gateway_nsjail_vs_bare_p50",
        "(a) print(1), gateway + nsjail / bare python3 -I, p50, in turns",
        "x", 1.0, True,
        _beside_bare("gateway_nsjail"),
    ),
    Goal(
        "gateway_nsjail_vs_bare_c4",
        "(b) exec/s at concurrency 4, gateway + nsjail / bare processes, in blocks",
        "x", 0.5, False,
        _c4_beside_bare,
    ),
    Goal(
        "noop_minus_healthz_p50_ms",
        "(c) no-op-backend execution - GET /healthz, same gateway, p50",
        "ms", 1.0, True,
        lambda r: _minus(_p50(r, "gateway_noop"), _p50(r, "gateway_healthz")),
    ),
    Goal(
        "gateway_gvisor_vs_bare_p50",
        "(d) print(1), gateway + docker-gvisor / bare python3 -I, p50, in turns",
        "x", 2.0, True,
        _beside_bare("gateway_gvisor"),
    ),
    Goal(
        "policy_embedded_p50_us",
        "(e) policy decision, embedded engine, p50",
        "us", 100.0, True,
        lambda r: _in_us(_p50(r, "policy_embedded")),
    ),
    Goal(
        "docker_pooled_vs_cli_c4_runc",
        "(f) exec/s at concurrency 4, pooled docker / docker run --rm (runc), in blocks",
        "x", 3.0, False,
        _docker("runc"),
    ),
    Goal(
        "docker_pooled_vs_cli_c4_runsc",
        "(f) the same, pooled docker-gvisor / docker run --rm (runsc), in blocks",
        "x", 3.0, False,
        _docker("runsc"),
    ),
    Goal(
        "docker_burst_vs_cli_c4_runc",
        "(f) the same, a burst the pool was configured to hold (runc)",
        "x", 3.0, False,
        _docker("runc", "backend_burst"),
    ),
    Goal(
        "docker_burst_vs_cli_c4_runsc",
        "(f) the same, a burst the pool was configured to hold (runsc)",
        "x", 3.0, False,
        _docker("runsc", "backend_burst"),
    ),
    Goal(
        "capture_on_vs_off_nsjail_p50",
        "(17) print(1), gateway + nsjail, behaviour capture on / off, p50",
        "x", 1.05, True,
        _capture("nsjail"),
    ),
    Goal(
        "capture_on_vs_off_gvisor_p50",
        "(17) print(1), gateway + docker-gvisor, behaviour capture on / off, p50",
        "x", 1.05, True,
        _capture("gvisor"),
    ),
)  # fmt: skip


def evaluate(results: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per goal: its figure (or why it is missing), the goal, met or not."""
    rows = []
    for goal in GOALS:
        figure = goal.figure(results)
        row: dict[str, Any] = {
            "key": goal.key,
            "label": goal.label,
            "unit": goal.unit,
            "goal": f"{'<=' if goal.at_most else '>='} {goal.goal:g}{goal.unit}",
        }
        if isinstance(figure, str):
            row |= {"value": None, "met": None, "why": figure}
        else:
            # The verdict is the figure's, not its rounding's: 0.497x misses >= 0.5x.
            met = figure <= goal.goal if goal.at_most else figure >= goal.goal
            row |= {"value": round(figure, DECIMALS), "met": met}
        rows.append(row)
    return rows


def render(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["", "ratios (issue 18; both sides measured in this run)"]
    for row in rows:
        if row["value"] is None:
            figure, verdict = "-", f"not measured: {row['why']}"
        else:
            figure, verdict = f"{row['value']:g}{row['unit']}", "met" if row["met"] else "missed"
        lines.append(f"  {row['label']:<78} {figure:>10}  goal {row['goal']:<9} {verdict}")
    return lines
