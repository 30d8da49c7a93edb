"""nsjail's log and the status decision: pure functions, every branch."""

from __future__ import annotations

import signal

import pytest

from backends.base import Limits, Status
from backends.cgroups import CgroupUsage
from backends.nsjail.log import NsjailReport, parse_log
from backends.nsjail.status import Observed, decide

T = "[I][2026-11-29T19:21:08+0000]"
EXITED = f"{T} Executing '/bin/bash' for '[STANDALONE MODE]'\n{T} pid=7 ([STANDALONE MODE]) exited with status: 3, (PIDs left: 0)\n"  # noqa: E501
SIGNALED = f"{T} Executing '/bin/bash' for '[STANDALONE MODE]'\n{T} pid=7 ([STANDALONE MODE]) terminated with signal: SIGSEGV (11), (PIDs left: 0)\n"  # noqa: E501
TIME_LIMIT = (
    f"{T} Executing '/bin/bash' for '[STANDALONE MODE]'\n"
    f"{T} pid=7 run time >= time limit (1 >= 1) ([STANDALONE MODE]). Killing it\n"
    f"{T} pid=7 ([STANDALONE MODE]) terminated with signal: SIGKILL (9), (PIDs left: 0)\n"
)
EXEC_FAILED = (
    f"{T} Executing '/usr/bin/nonexist' for '[STANDALONE MODE]'\n"
    "[E][2026-11-29T19:21:09+0000][1] newProc():232 execve('/usr/bin/nonexist') failed\n"
    "[F][2026-11-29T19:21:09+0000][1] runChild():506 Launching child process failed\n"
    f"{T} pid=7 ([STANDALONE MODE]) exited with status: 255, (PIDs left: 0)\n"
)
POLICY_FAILED = (
    "[F][2026-11-29T19:19:24+0000][12762] main():359 Couldn't prepare sandboxing policy\n"
)


def test_parse_exit_status() -> None:
    report = parse_log(EXITED)
    assert (report.executed, report.exit_status, report.signal) == (True, 3, None)
    assert not report.failed and not report.time_limit_hit


def test_parse_signal_and_time_limit() -> None:
    assert parse_log(SIGNALED).signal == 11
    report = parse_log(TIME_LIMIT)
    assert report.time_limit_hit and report.signal == 9


@pytest.mark.parametrize("text", [EXEC_FAILED, POLICY_FAILED, ""])
def test_nsjail_failures_are_recognised(text: str) -> None:
    assert parse_log(text).failed


LIMITS = Limits(timeout_s=2, memory_mb=64, pids=8, disk_mb=4, output_bytes=100)


def verdict(
    log: str = EXITED,
    usage: CgroupUsage | None = None,
    **seen: object,
) -> tuple[Status, int | None, set[str]]:
    observed = Observed(
        **{  # type: ignore[arg-type]
            "returncode": 0,
            "output_limit_hit": False,
            "deadline_hit": False,
            "disk_full": False,
            "rlimit_cpu_s": 3,
            **seen,
        }
    )
    v = decide(observed, parse_log(log), usage or CgroupUsage(), LIMITS)
    return v.status, v.exit_code, {e.kind for e in v.events}


OK_LOG = EXITED.replace("status: 3", "status: 0")


def test_ok_and_error() -> None:
    assert verdict(OK_LOG) == (Status.OK, 0, set())
    assert verdict(EXITED) == (Status.ERROR, 3, set())


def test_signal_is_killed_with_shell_style_exit_code() -> None:
    assert verdict(SIGNALED) == (Status.KILLED, 139, {"signal"})


def test_output_limit_wins() -> None:
    status, code, events = verdict(SIGNALED, output_limit_hit=True, deadline_hit=True)
    assert (status, code) == (Status.OUTPUT_LIMIT, None)
    assert "output_limit" in events


def test_deadline_and_nsjail_time_limit_are_timeouts() -> None:
    assert verdict("", returncode=-9, deadline_hit=True)[:2] == (Status.TIMEOUT, None)
    assert verdict(TIME_LIMIT)[0] == Status.TIMEOUT
    assert "time_limit" in verdict(TIME_LIMIT)[2]


def test_cpu_rlimit_is_a_timeout() -> None:
    xcpu = SIGNALED.replace("SIGSEGV (11)", f"SIGXCPU ({signal.SIGXCPU.value})")
    assert verdict(xcpu)[0] == Status.TIMEOUT
    kill = SIGNALED.replace("SIGSEGV (11)", "SIGKILL (9)")
    status, _, events = verdict(kill, CgroupUsage(cpu_ns=3_100_000_000))
    assert status == Status.TIMEOUT and "cpu_limit" in events


def test_oom() -> None:
    kill = SIGNALED.replace("SIGSEGV (11)", "SIGKILL (9)")
    assert verdict(kill, CgroupUsage(oom_kills=1)) == (Status.OOM, 137, {"oom"})
    # A child was OOM-killed but the program coped and exited 0: honest ok.
    assert verdict(OK_LOG, CgroupUsage(oom_kills=1)) == (Status.OK, 0, {"oom"})


def test_limits_hit_are_events_even_when_they_do_not_decide() -> None:
    status, _, events = verdict(
        EXITED, CgroupUsage(pids_max_hits=5), disk_full=True, skipped_files=("big: too big",)
    )
    assert status == Status.ERROR
    assert events == {"pids_limit", "disk_limit", "output_files_limit"}


def test_file_size_signal() -> None:
    xfsz = SIGNALED.replace("SIGSEGV (11)", f"SIGXFSZ ({signal.SIGXFSZ.value})")
    assert verdict(xfsz)[0] == Status.KILLED
    assert "file_size_limit" in verdict(xfsz)[2]


def test_nsjail_killed_without_log_falls_back_to_its_return_code() -> None:
    assert verdict("", returncode=-9)[:2] == (Status.KILLED, 137)
    assert verdict("", returncode=0)[:2] == (Status.OK, 0)


def test_backend_shutdown_is_killed() -> None:
    assert verdict("", returncode=-9, stopped=True)[:2] == (Status.KILLED, None)


def test_report_type_is_frozen() -> None:
    report = parse_log(OK_LOG)
    assert isinstance(report, NsjailReport)
    with pytest.raises(AttributeError):
        report.signal = 1  # type: ignore[misc]
