"""How the docker backends turn what they saw into a status (pure)."""

from __future__ import annotations

import signal
from typing import Any

from backends.base import Limits, Status
from backends.docker.status import Observed, decide

LIMITS = Limits()


def seen(exit_code: int | None, report: dict[str, Any] | None = None, **kw: Any) -> Observed:
    defaults: dict[str, Any] = {"oom_killed": False, "output_limit_hit": False,
                                "deadline_hit": False}  # fmt: skip
    defaults.update(kw)
    return Observed(exit_code=exit_code, report=report, **defaults)


def exited(code: int) -> dict[str, Any]:
    return {"wait_status": code << 8, "cpu_ms": 12, "max_rss_kb": 3000}


def killed(signo: int) -> dict[str, Any]:
    return {"wait_status": signo, "cpu_ms": 1, "max_rss_kb": 10}


def test_ok_and_error_with_usage() -> None:
    ok = decide(seen(0, exited(0)), LIMITS)
    assert (ok.status, ok.exit_code, ok.usage.cpu_ms, ok.report_trusted) == (Status.OK, 0, 12, True)
    error = decide(seen(3, exited(3)), LIMITS)
    assert (error.status, error.exit_code) == (Status.ERROR, 3)


def test_signal_is_killed_and_told_apart_from_an_exit_code() -> None:
    crash = decide(seen(139, killed(signal.SIGSEGV)), LIMITS)
    assert (crash.status, crash.exit_code) == (Status.KILLED, 139)
    assert any(e.kind == "signal" and "SIGSEGV" in e.detail for e in crash.events)
    plain = decide(seen(139, exited(139)), LIMITS)
    assert plain.status == Status.ERROR


def test_without_a_credible_report_the_engine_decides() -> None:
    verdict = decide(seen(7, None), LIMITS)
    assert (verdict.status, verdict.exit_code) == (Status.ERROR, 7)
    assert not verdict.report_trusted and verdict.usage.cpu_ms == 0
    odd = decide(seen(0, {"wait_status": "0", "cpu_ms": -5}), LIMITS)
    assert not odd.report_trusted and odd.status == Status.OK
    # A report whose program exited 0 needs no engine at all.
    assert decide(seen(None, exited(0)), LIMITS).status == Status.OK


def test_oom_from_the_engine() -> None:
    # gVisor: the whole sandbox is killed, no report; runc: the program is.
    for verdict in (decide(seen(137, None, oom_killed=True), LIMITS),
                    decide(seen(137, killed(9), oom_killed=True), LIMITS)):  # fmt: skip
        assert verdict.status == Status.OOM
        assert any(e.kind == "oom" for e in verdict.events)
    # A child was OOM-killed but the program itself succeeded: ok, with the event.
    survived = decide(seen(0, exited(0), oom_killed=True), LIMITS)
    assert survived.status == Status.OK and any(e.kind == "oom" for e in survived.events)


def test_our_own_limits_come_first() -> None:
    assert decide(seen(137, None, deadline_hit=True), LIMITS).status == Status.TIMEOUT
    capped = decide(seen(137, None, output_limit_hit=True, deadline_hit=True), LIMITS)
    assert capped.status == Status.OUTPUT_LIMIT
    assert decide(seen(137, None, stopped=True), LIMITS).status == Status.KILLED
    backstop = decide(seen(137, {**killed(9), "backstop": True}), LIMITS)
    assert backstop.status == Status.TIMEOUT
    assert any(e.kind == "time_limit" for e in backstop.events)


def test_protocol_abuse_and_a_dead_launcher_are_killed() -> None:
    garbled = decide(seen(0, None, protocol_error="frame of 1 GB"), LIMITS)
    assert garbled.status == Status.KILLED
    assert any(e.kind == "sandbox_protocol" for e in garbled.events)
    init_killed = decide(seen(137, None), LIMITS)
    assert (init_killed.status, init_killed.exit_code) == (Status.KILLED, 137)


def test_limits_seen_by_the_launcher_are_events() -> None:
    verdict = decide(
        seen(0, {**exited(0), "disk_full": True}, skipped_files=("big: over 8 bytes",)), LIMITS
    )
    assert verdict.status == Status.OK
    assert {e.kind for e in verdict.events} == {"disk_limit", "output_files_limit"}
    xcpu = decide(seen(128 + signal.SIGXCPU, killed(signal.SIGXCPU)), LIMITS)
    assert xcpu.status == Status.TIMEOUT
