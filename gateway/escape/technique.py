"""A technique as data: what it tries, the probe program, how it is judged.

A probe runs through the backend's `run()` (the path executions take). It first
prints a start line carrying a nonce only the runner knows (`@@MARK@@`), then one
JSON line: {"escaped": bool, "detail": str} or {"na": reason}. The verdict is the
probe's word combined with the host's evidence: a host check that failed (a
canary touched, a host setting changed, a process left behind) is an escape
whatever the probe said.

Containment has to be shown, never assumed: a probe that never started (a
runtime that runs nothing, an interpreter that exits first) or that started and
fell silent proves nothing, and a backend that refuses the run proves nothing
either. Those are errors of the suite (`Outcome.ERROR`), and a backend with any
is not sound. "Not applicable" is only ever the probe's own finding.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from backends.base import ExecResult, Limits, Status

CATEGORIES = (
    "posture", "host_files", "kernel", "privilege", "neighbours", "secrets",
    "output", "network", "resources", "residue",
)  # fmt: skip
# What the attempts of a category leave in their execution's behaviour record (any
# one of these kinds, backends/capture/record.py KINDS) on a backend that records
# it: the suite proves that what the sandbox stopped was also seen. The others
# (posture, resources, output, network, residue) try nothing a record names.
LEAVES: dict[str, frozenset[str]] = {
    "host_files": frozenset({"files", "lookups"}),
    "secrets": frozenset({"files"}),
    "kernel": frozenset({"files", "syscalls"}),
    "privilege": frozenset({"syscalls", "files", "programs"}),
    "neighbours": frozenset({"signals", "syscalls", "files", "lookups", "sockets", "ipc"}),
}


class Outcome(enum.StrEnum):
    CONTAINED = "contained"
    ESCAPED = "escaped"
    NOT_APPLICABLE = "not_applicable"
    # The suite could not judge: the probe did not run or report, the backend failed.
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: Outcome
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Probe:
    """One program: `@@HOST@@` in its code is replaced by the host facts (JSON)."""

    language: str
    code: str
    limits: Limits = field(default_factory=lambda: Limits(timeout_s=10.0))


@dataclass(slots=True)
class Evidence:
    """What the runner saw: the results (probe, then follow-up) and host findings."""

    results: list[ExecResult]
    host_findings: list[str] = field(default_factory=list)
    stalled: bool = False
    host: dict[str, Any] = field(default_factory=dict)
    # The nonce of this run's start lines ("" in judge tests that need no start).
    mark: str = ""

    @property
    def result(self) -> ExecResult:
        return self.results[0]

    def started(self, index: int) -> bool:
        """Result `index` printed this run's start line: the probe itself ran."""
        line = start_line(self.mark).encode()
        return any(out.strip() == line for out in self.results[index].stdout.splitlines())

    def not_started(self) -> list[int]:
        return [i for i in range(len(self.results)) if not self.started(i)]

    def report(self, index: int = -1) -> dict[str, Any] | None:
        """The last JSON object the probe (default: the last one run) printed."""
        for line in reversed(self.results[index].stdout.decode(errors="replace").splitlines()):
            line = line.strip()
            if line.startswith("{"):
                try:
                    value = json.loads(line)
                except ValueError:
                    continue
                if isinstance(value, dict) and "started" not in value:
                    return value
        return None


Judge = Callable[[Evidence], Verdict]


def start_line(mark: str) -> str:
    return json.dumps({"started": mark})


def silent(evidence: Evidence) -> Verdict:
    """The probe started and then said nothing: stopped by the sandbox, or broken."""
    result = evidence.results[-1]
    tail = result.stderr.decode(errors="replace").strip()[-160:]
    if result.status in (Status.OK, Status.ERROR):
        # It ran to its end without a word (a crash, an early exit): nothing was
        # proven either way, and that is the suite's failure, not the backend's merit.
        return Verdict(Outcome.ERROR, f"the probe started but did not report: {tail}")
    # Stopped (a seccomp kill, a limit) after it started, at its attempt.
    return Verdict(Outcome.CONTAINED, f"stopped after it started ({result.status.value}): {tail}")


def probe_says(evidence: Evidence) -> Verdict:
    """The default judge: the probe's own report (the host findings come on top)."""
    report = evidence.report()
    if report is None:
        return silent(evidence)
    if "na" in report:
        return Verdict(Outcome.NOT_APPLICABLE, str(report["na"]))
    outcome = Outcome.ESCAPED if report.get("escaped") else Outcome.CONTAINED
    return Verdict(outcome, str(report.get("detail", ""))[:300])


@dataclass(frozen=True, slots=True)
class Technique:
    id: str
    category: str
    tries: str
    probe: Probe
    judge: Judge = probe_says
    # Run after the probe (or at the same time if `concurrent`): residue checks.
    followup: Probe | None = None
    concurrent: bool = False
    # The kinds of attempt its record must show (any one); None: its category's.
    leaves: frozenset[str] | None = None

    def __post_init__(self) -> None:
        if self.category not in CATEGORIES:
            raise ValueError(f"{self.id}: unknown category {self.category!r}")

    @property
    def expected(self) -> frozenset[str]:
        return self.leaves if self.leaves is not None else LEAVES.get(self.category, frozenset())


def python(code: str, **limits: Any) -> Probe:
    from gateway.escape.prelude import PRELUDE

    return Probe("python", PRELUDE + code, Limits(**{"timeout_s": 10.0, **limits}))


def bash(code: str, **limits: Any) -> Probe:
    # The start line as bash prints it: `start_line` with the mark substituted.
    started = "echo '" + start_line("@@MARK@@") + "'\n"
    return Probe("bash", started + code, Limits(**{"timeout_s": 10.0, **limits}))
