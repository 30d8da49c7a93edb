"""The catalog as data, and the judges on real results (no sandbox needed)."""

from __future__ import annotations

from backends.base import ExecResult, OutputFile, Status, Usage
from gateway.escape.catalog import techniques
from gateway.escape.catalog_resources import output_bounded, output_collected
from gateway.escape.runner import judge
from gateway.escape.technique import CATEGORIES, Evidence, Outcome, probe_says


def result(stdout: bytes = b"", files: tuple[OutputFile, ...] = ()) -> ExecResult:
    return ExecResult(Status.OK, 0, stdout, b"", False, False, 5, Usage(), files)


def test_at_least_45_techniques_cover_every_category() -> None:
    found = techniques()
    assert len(found) >= 45
    assert {t.category for t in found} == set(CATEGORIES)
    assert len({t.id for t in found}) == len(found)
    assert all(t.id.startswith(t.category + ".") for t in found)


def test_probes_only_name_loopback_addresses() -> None:
    for t in techniques():
        code = t.probe.code + (t.followup.code if t.followup else "")
        for address in ("8.8.8.8", "1.1.1.1", "0.0.0.0", "getaddrinfo"):
            assert address not in code, (t.id, address)


def test_the_probe_decides_and_host_findings_override() -> None:
    technique = techniques()[0]
    contained = Evidence([result(b'noise\n{"escaped": false, "detail": "ok"}\n')])
    assert judge(technique, contained).outcome == Outcome.CONTAINED
    escaped = Evidence([result(b'{"escaped": true, "detail": "x"}\n')])
    assert judge(technique, escaped).outcome == Outcome.ESCAPED
    touched = Evidence([result(b'{"escaped": false}\n')], host_findings=["canary changed"])
    verdict = judge(technique, touched)
    assert verdict.outcome == Outcome.ESCAPED and "canary changed" in verdict.detail
    stalled = Evidence([], stalled=True)
    assert judge(technique, stalled).outcome == Outcome.ESCAPED
    assert probe_says(Evidence([result(b'{"na": "why"}')])).outcome == Outcome.NOT_APPLICABLE


def test_output_collection_judge_sees_host_content_and_traversal() -> None:
    host = {"token": "abc", "shadow_head": "root:$6$x"}
    clean = Evidence([result(files=(OutputFile("a.txt", 2, b"hi"),))], host=host)
    assert output_collected(clean).outcome == Outcome.CONTAINED
    for bad in (OutputFile("../x", 1, b"x"), OutputFile("l", 11, b"CANARY-abc\n"),
                OutputFile("s", 1 << 40, b"")):  # fmt: skip
        assert output_collected(Evidence([result(files=(bad,))], host=host)).outcome == (
            Outcome.ESCAPED
        )
    flood = Evidence([result(stdout=b"x" * (64 * 1024 + 1))])
    assert output_bounded(flood).outcome == Outcome.ESCAPED
