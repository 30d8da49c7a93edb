"""Runs the suite against one started backend: one probe at a time, then the
host checks, then the verdict."""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from backends.base import BackendError, ExecResult, ExecSpec, SandboxBackend, Status
from gateway.escape.catalog import techniques
from gateway.escape.host import HostCanaries
from gateway.escape.residue import leftovers
from gateway.escape.technique import Evidence, Outcome, Probe, Technique, Verdict

# Beyond the probe's own deadline: longer than this and the backend hung on it.
STALL_MARGIN_S = 30.0


@dataclass(frozen=True, slots=True)
class Finding:
    technique: Technique
    verdict: Verdict
    duration_ms: int


@dataclass(frozen=True, slots=True)
class SuiteResult:
    backend: str
    findings: tuple[Finding, ...]
    duration_ms: int

    def count(self, outcome: Outcome) -> int:
        return sum(1 for f in self.findings if f.verdict.outcome == outcome)

    @property
    def escaped(self) -> list[Finding]:
        return [f for f in self.findings if f.verdict.outcome == Outcome.ESCAPED]


async def run_suite(
    backend: SandboxBackend,
    selected: Iterable[Technique] | None = None,
    credential_files: tuple[str, ...] = (),
    progress: Callable[[Finding], None] | None = None,
    canary_dir: Path | None = None,
) -> SuiteResult:
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
    return SuiteResult(backend.name, tuple(found), int((time.monotonic() - started) * 1000))


async def run_one(backend: SandboxBackend, technique: Technique, host: HostCanaries) -> Finding:
    started = time.monotonic()
    mark = f"execgate-mark-{secrets.token_hex(6)}"
    facts = json.dumps(host.facts)
    probes = [technique.probe] + ([technique.followup] if technique.followup else [])
    specs = [_spec(p, facts, mark) for p in probes]
    evidence = Evidence(results=[], host=host.facts)
    try:
        if technique.concurrent:
            evidence.results = list(await asyncio.gather(*(_run(backend, s) for s in specs)))
        else:
            for spec in specs:
                evidence.results.append(await _run(backend, spec))
    except TimeoutError:
        evidence.stalled = True
    except BackendError as exc:
        verdict = Verdict(Outcome.CONTAINED, f"the backend refused the run: {exc}")
        findings = await host.findings() + await leftovers(backend)
        if findings:
            verdict = Verdict(Outcome.ESCAPED, "; ".join(findings))
        return Finding(technique, verdict, _ms(started))
    evidence.host_findings = await host.findings() + await leftovers(backend)
    return Finding(technique, judge(technique, evidence), _ms(started))


def judge(technique: Technique, evidence: Evidence) -> Verdict:
    if evidence.stalled:
        return Verdict(Outcome.ESCAPED, "the backend did not return: the run hung it")
    if not any(_ran(r) for r in evidence.results):
        return Verdict(Outcome.NOT_APPLICABLE, "no sign that the probe ran at all")
    verdict = technique.judge(evidence)
    if evidence.host_findings:
        detail = "host: " + "; ".join(evidence.host_findings)
        return Verdict(Outcome.ESCAPED, f"{detail}; probe: {verdict.detail}"[:400])
    return verdict


def _ran(result: ExecResult) -> bool:
    """Every probe prints, or is stopped: silence and success means nothing ran."""
    return bool(result.stdout or result.stderr or result.events) or result.status != Status.OK


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
