"""From what was observed to an honest status: a pure function.

Inputs are what the backend saw (our deadline, the output cap), what nsjail
logged (exit status or signal, its own time limit) and what the cgroup counted
(OOM kills, pids-limit hits, CPU time). Every limit that was hit becomes an
event, whether or not it decided the status.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass

from backends.base import Limits, SandboxEvent, Status
from backends.cgroups import CgroupUsage
from backends.nsjail.log import NsjailReport


@dataclass(frozen=True, slots=True)
class Observed:
    returncode: int  # nsjail's (negative: nsjail itself died of that signal)
    output_limit_hit: bool
    deadline_hit: bool
    disk_full: bool
    rlimit_cpu_s: int
    stopped: bool = False  # the backend was closed while it ran
    skipped_files: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Verdict:
    status: Status
    exit_code: int | None
    events: tuple[SandboxEvent, ...]


def _signal_name(signo: int) -> str:
    try:
        return signal.Signals(signo).name
    except ValueError:
        return f"signal {signo}"


def decide(seen: Observed, report: NsjailReport, usage: CgroupUsage, limits: Limits) -> Verdict:
    events: list[SandboxEvent] = []
    # How the program ended: nsjail's log first, its own exit code otherwise
    # (when nsjail was killed with the sandbox it could not log anything).
    exit_status, signo = report.exit_status, report.signal
    if exit_status is None and signo is None:
        if seen.returncode < 0:
            signo = -seen.returncode
        else:
            exit_status = seen.returncode

    cpu_limit = signo == signal.SIGXCPU or (
        signo == signal.SIGKILL and usage.cpu_ns >= seen.rlimit_cpu_s * 1_000_000_000
    )
    if seen.output_limit_hit:
        events.append(
            SandboxEvent("output_limit", f"stdout+stderr over {limits.output_bytes} bytes")
        )
    if seen.stopped:
        events.append(SandboxEvent("shutdown", "the backend closed while it ran"))
    if seen.deadline_hit:
        events.append(SandboxEvent("deadline", f"wall time over {limits.timeout_s:g} s"))
    if report.time_limit_hit:
        events.append(SandboxEvent("time_limit", "nsjail's time limit killed the sandbox"))
    if cpu_limit:
        events.append(SandboxEvent("cpu_limit", f"CPU time over {seen.rlimit_cpu_s} s"))
    if usage.oom_kills:
        events.append(
            SandboxEvent("oom", f"memory over {limits.memory_mb} MiB: {usage.oom_kills} killed")
        )
    if usage.pids_max_hits:
        events.append(
            SandboxEvent(
                "pids_limit", f"{usage.pids_max_hits} forks refused at {limits.pids} processes"
            )
        )
    if seen.disk_full:
        events.append(SandboxEvent("disk_limit", f"workspace full at {limits.disk_mb} MiB"))
    if signo == signal.SIGXFSZ:
        events.append(SandboxEvent("file_size_limit", f"a file grew past {limits.disk_mb} MiB"))
    if seen.skipped_files:
        events.append(SandboxEvent("output_files_limit", "; ".join(seen.skipped_files[:5])))

    natural = exit_status if signo is None else 128 + signo
    if seen.output_limit_hit:
        return Verdict(Status.OUTPUT_LIMIT, None, tuple(events))
    if seen.stopped:
        return Verdict(Status.KILLED, None, tuple(events))
    if seen.deadline_hit or report.time_limit_hit:
        return Verdict(Status.TIMEOUT, None, tuple(events))
    if cpu_limit:
        return Verdict(Status.TIMEOUT, natural, tuple(events))
    if usage.oom_kills and natural != 0:
        return Verdict(Status.OOM, natural, tuple(events))
    if signo is not None:
        events.append(SandboxEvent("signal", f"terminated by {_signal_name(signo)}"))
        return Verdict(Status.KILLED, natural, tuple(events))
    return Verdict(Status.OK if exit_status == 0 else Status.ERROR, exit_status, tuple(events))
