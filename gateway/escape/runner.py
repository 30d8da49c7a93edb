"""Runs the suite against one started backend: one probe at a time, then the
host checks, then the verdict.

A run is sound only when nothing escaped, nothing errored (a probe that did not
run or report, a backend that failed the run) and no more techniques than the
backend's ceiling were not applicable: a sandbox that runs nothing, or refuses
everything, is never called sound."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from backends.base import BackendError, ExecResult, ExecSpec, SandboxBackend
from backends.capture.record import Behaviour
from gateway.escape.catalog.index import techniques
from gateway.escape.host import HostCanaries
from gateway.escape.residue import leftovers
from gateway.escape.technique import Evidence, Outcome, Probe, Technique, Verdict

# Beyond the probe's own deadline: longer than this and the backend hung on it.
STALL_MARGIN_S = 30.0

# How many techniques each backend may find not applicable (its probes say why:
# gVisor's /proc has no NoNewPrivs line, a host with port 53 taken has no DNS
# canary, ...). More than that and the run is not sound: a backend on which the
# probes cannot tell is no proven backend. Unknown backends may have none.
NOT_APPLICABLE_CEILING = {"nsjail": 1, "docker": 1, "docker-gvisor": 2}


@dataclass(frozen=True, slots=True)
class Finding:
    technique: Technique
    verdict: Verdict
    duration_ms: int
    # What the backend recorded of each probe run (its behaviour record): the suite
    # also proves that what the sandbox stopped was seen.
    behaviour: tuple[Behaviour, ...] = ()
    # The kinds of attempt the backend recorded when the technique ran (empty:
    # capture was off, nothing can be asked of the record).
    watched: frozenset[str] = frozenset()

    @property
    def seen(self) -> frozenset[str]:
        """The kinds of attempt the technique's runs left in their records."""
        return frozenset().union(*(b.kinds() for b in self.behaviour if b.capture == "on"))

    @property
    def expected(self) -> frozenset[str]:
        """The kinds its record must show here (one of them): what the technique
        leaves that this backend records."""
        return self.technique.expected & self.watched

    @property
    def recorded(self) -> bool:
        """The technique's attempt shows in its execution's behaviour record."""
        if self.expected:
            return bool(self.seen & self.expected)
        return any(b.capture == "on" and (not b.empty or b.dropped) for b in self.behaviour)

    @property
    def unrecorded(self) -> bool:
        """It should have shown in the record and did not (the suite's problem:
        an attempt the sandbox stopped and nobody saw)."""
        return (
            bool(self.expected)
            and self.verdict.outcome in (Outcome.CONTAINED, Outcome.ESCAPED)
            and not self.recorded
        )


@dataclass(frozen=True, slots=True)
class SuiteResult:
    backend: str
    findings: tuple[Finding, ...]
    duration_ms: int
    max_not_applicable: int = 0

    def count(self, outcome: Outcome) -> int:
        return sum(1 for f in self.findings if f.verdict.outcome == outcome)

    def having(self, outcome: Outcome) -> list[Finding]:
        return [f for f in self.findings if f.verdict.outcome == outcome]

    @property
    def escaped(self) -> list[Finding]:
        return self.having(Outcome.ESCAPED)

    @property
    def errors(self) -> list[Finding]:
        return self.having(Outcome.ERROR)

    @property
    def problems(self) -> list[str]:
        """Why the run is not sound (empty: it is)."""
        found = []
        if self.escaped:
            found.append(f"escaped: {', '.join(f.technique.id for f in self.escaped)}")
        if self.errors:
            found.append(f"errors: {', '.join(f.technique.id for f in self.errors)}")
        na = self.count(Outcome.NOT_APPLICABLE)
        if na > self.max_not_applicable:
            found.append(f"{na} not applicable, more than the {self.max_not_applicable} allowed")
        if unseen := [f.technique.id for f in self.findings if f.unrecorded]:
            found.append(f"not in their behaviour record: {', '.join(unseen)}")
        if not self.findings:
            found.append("no technique was run")
        return found

    @property
    def sound(self) -> bool:
        return not self.problems


async def run_suite(
    backend: SandboxBackend,
    selected: Iterable[Technique] | None = None,
    credential_files: tuple[str, ...] = (),
    progress: Callable[[Finding], None] | None = None,
    canary_dir: Path | None = None,
    max_not_applicable: int | None = None,
) -> SuiteResult:
    """`max_not_applicable`: the ceiling (default: the backend's, NOT_APPLICABLE_CEILING)."""
    started = time.monotonic()
    chosen = list(selected) if selected is not None else techniques()
    found = []
    async with HostCanaries(credential_files, canary_dir) as host:
        await host.findings()
        for technique in chosen:
            finding = await run_one(backend, technique, host)
            found.append(finding)
            if progress is not None:
                progress(finding)
    if max_not_applicable is None:
        max_not_applicable = NOT_APPLICABLE_CEILING.get(backend.name, 0)
    return SuiteResult(backend.name, tuple(found), _ms(started), max_not_applicable)


async def run_one(backend: SandboxBackend, technique: Technique, host: HostCanaries) -> Finding:
    started = time.monotonic()
    mark = f"execgate-mark-{secrets.token_hex(6)}"
    facts = json.dumps(host.facts)
    probes = [technique.probe] + ([technique.followup] if technique.followup else [])
    specs = [_spec(p, facts, mark) for p in probes]
    evidence = Evidence(results=[], host=host.facts, mark=mark)
    failure = ""
    try:
        if technique.concurrent:
            evidence.results = list(await asyncio.gather(*(_run(backend, s) for s in specs)))
        else:
            for spec in specs:
                evidence.results.append(await _run(backend, spec))
    except TimeoutError:
        evidence.stalled = True
    except BackendError as exc:
        # Refusing a run is no containment: nothing was tried, nothing proven.
        failure = f"the backend failed the run: {exc}"
    evidence.host_findings = await host.findings() + await leftovers(backend)
    if failure:
        verdict = Verdict(Outcome.ERROR, failure[:400])
        if evidence.host_findings:
            verdict = Verdict(Outcome.ESCAPED, "host: " + "; ".join(evidence.host_findings))
        return Finding(technique, verdict, _ms(started))
    seen = tuple(r.behaviour for r in evidence.results if r.behaviour is not None)
    return Finding(
        technique, judge(technique, evidence), _ms(started), seen, backend.recorded_kinds()
    )


def judge(technique: Technique, evidence: Evidence) -> Verdict:
    if evidence.stalled:
        return Verdict(Outcome.ESCAPED, "the backend did not return: the run hung it")
    if evidence.host_findings:
        # The host's evidence stands whatever the probe said, or whether it ran.
        probe = technique.judge(evidence).detail if not evidence.not_started() else "did not run"
        detail = "host: " + "; ".join(evidence.host_findings)
        return Verdict(Outcome.ESCAPED, f"{detail}; probe: {probe}"[:400])
    missing = evidence.not_started()
    if missing:
        result = evidence.results[missing[0]]
        tail = (result.stdout + result.stderr).decode(errors="replace").strip()[-160:]
        return Verdict(
            Outcome.ERROR,
            f"the probe did not run (no start line; {result.status.value}, exit "
            f"{result.exit_code}): {tail}",
        )
    report = evidence.report()
    if report is not None and "na" in report:
        # The probe's own finding, whatever the technique's judge looks at.
        return Verdict(Outcome.NOT_APPLICABLE, str(report["na"])[:300])
    return technique.judge(evidence)


def _spec(probe: Probe, facts: str, mark: str) -> ExecSpec:
    # MARKRE matches the mark but not itself: grep's own command line holds it.
    code = probe.code.replace("@@HOST@@", facts).replace("@@MARKRE@@", "[e]" + mark[1:])
    code = code.replace("@@MARK@@", mark)
    return ExecSpec(f"escape-{secrets.token_hex(6)}", probe.language, code, probe.limits)


async def _run(backend: SandboxBackend, spec: ExecSpec) -> ExecResult:
    async with asyncio.timeout(spec.limits.timeout_s + STALL_MARGIN_S):
        return await backend.run(spec)


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
