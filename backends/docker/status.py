"""From what was observed to an honest status: a pure function.

Inputs are what the gateway saw itself (our deadline, the output cap, a broken
protocol), what the engine says (the container's exit code and OOMKilled, asked
whenever the launcher's report is missing or the program was SIGKILLed, as the OOM
killer does) and the launcher's exit report, already authenticated by its nonce
(how the program ended, disk, usage). Without a report the engine's word stands
alone and usage is unknown (zero).
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Any

from backends.base import Limits, SandboxEvent, Status, Usage


@dataclass(frozen=True, slots=True)
class Observed:
    exit_code: int | None  # the engine's (the launcher's, so the program's); None: not asked
    oom_killed: bool
    report: dict[str, Any] | None  # the launcher's, authenticated
    output_limit_hit: bool
    deadline_hit: bool
    stopped: bool = False  # the backend was closed while it ran
    protocol_error: str = ""
    skipped_files: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Verdict:
    status: Status
    exit_code: int | None
    events: tuple[SandboxEvent, ...]
    usage: Usage
    report_trusted: bool


def _signal_name(signo: int) -> str:
    try:
        return signal.Signals(signo).name
    except ValueError:
        return f"signal {signo}"


def program_end(report: dict[str, Any] | None) -> tuple[int | None, int | None]:
    """(exit status, signal) of the program per the report, if it says."""
    status = (report or {}).get("wait_status")
    if not isinstance(status, int) or isinstance(status, bool) or not 0 <= status < 1 << 16:
        return None, None
    if os.WIFSIGNALED(status):
        return None, os.WTERMSIG(status)
    if os.WIFEXITED(status):
        return os.WEXITSTATUS(status), None
    return None, None


def _usage(report: dict[str, Any]) -> Usage:
    def number(key: str) -> int:
        value = report.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

    return Usage(cpu_ms=number("cpu_ms"), max_rss_kb=number("max_rss_kb"))


def decide(seen: Observed, limits: Limits) -> Verdict:
    events: list[SandboxEvent] = []
    exit_status, signo = program_end(seen.report)
    trusted = exit_status is not None or signo is not None
    report = seen.report if trusted and seen.report is not None else {}
    if not trusted:
        # No report: the launcher itself ended (or was killed); the engine says how.
        code = 137 if seen.exit_code is None else seen.exit_code
        if code >= 128 and not seen.oom_killed:
            signo = code - 128
        else:
            exit_status = code

    if seen.output_limit_hit:
        events.append(
            SandboxEvent("output_limit", f"stdout+stderr over {limits.output_bytes} bytes")
        )
    if seen.stopped:
        events.append(SandboxEvent("shutdown", "the backend closed while it ran"))
    if seen.deadline_hit:
        events.append(SandboxEvent("deadline", f"wall time over {limits.timeout_s:g} s"))
    if report.get("backstop"):
        events.append(SandboxEvent("time_limit", "the launcher's own deadline ended the run"))
    if seen.protocol_error:
        events.append(SandboxEvent("sandbox_protocol", seen.protocol_error[:200]))
    if signo == signal.SIGXCPU:
        events.append(SandboxEvent("cpu_limit", "per-process CPU time limit"))
    if seen.oom_killed:
        events.append(SandboxEvent("oom", f"memory over {limits.memory_mb} MiB"))
    if report.get("disk_full"):
        events.append(SandboxEvent("disk_limit", f"workspace full at {limits.disk_mb} MiB"))
    if signo == signal.SIGXFSZ:
        events.append(SandboxEvent("file_size_limit", "a file grew past the size limit"))
    if seen.skipped_files:
        events.append(SandboxEvent("output_files_limit", "; ".join(seen.skipped_files[:5])))

    usage = _usage(report)
    natural = exit_status if signo is None else 128 + signo

    def verdict(status: Status, code: int | None) -> Verdict:
        return Verdict(status, code, tuple(events), usage, trusted)

    if seen.output_limit_hit:
        return verdict(Status.OUTPUT_LIMIT, None)
    if seen.stopped:
        return verdict(Status.KILLED, None)
    if seen.deadline_hit or report.get("backstop"):
        return verdict(Status.TIMEOUT, None)
    if seen.protocol_error:
        return verdict(Status.KILLED, None)
    if signo == signal.SIGXCPU:
        return verdict(Status.TIMEOUT, natural)
    if seen.oom_killed and natural != 0:
        return verdict(Status.OOM, natural)
    if signo is not None:
        events.append(SandboxEvent("signal", f"terminated by {_signal_name(signo)}"))
        return verdict(Status.KILLED, natural)
    return verdict(Status.OK if exit_status == 0 else Status.ERROR, exit_status)
