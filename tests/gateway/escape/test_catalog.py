"""The catalog as data, and the judges on real results (no sandbox needed)."""

from __future__ import annotations

import pytest

from backends.base import ExecResult, OutputFile, Status, Usage
from gateway.escape.catalog.index import techniques
from gateway.escape.catalog.resources import (
    cpu_bounded,
    ended,
    ended_quietly,
    output_bounded,
    output_collected,
)
from gateway.escape.runner import judge
from gateway.escape.technique import CATEGORIES, Evidence, Outcome, probe_says, start_line

MARK = "execgate-mark-0123456789ab"
STARTED = (start_line(MARK) + "\n").encode()


def result(
    stdout: bytes = b"",
    files: tuple[OutputFile, ...] = (),
    status: Status = Status.OK,
    stderr: bytes = b"",
    **usage: int,
) -> ExecResult:
    return ExecResult(status, 0, stdout, stderr, False, False, 1000, Usage(**usage), files)


def started(stdout: bytes = b"", **kwargs: object) -> ExecResult:
    return result(STARTED + stdout, **kwargs)  # type: ignore[arg-type]


def evidence(*results: ExecResult, **kwargs: object) -> Evidence:
    return Evidence(list(results), mark=MARK, **kwargs)  # type: ignore[arg-type]


def test_at_least_45_techniques_cover_every_category() -> None:
    found = techniques()
    assert len(found) >= 45
    assert {t.category for t in found} == set(CATEGORIES)
    assert len({t.id for t in found}) == len(found)
    assert all(t.id.startswith(t.category + ".") for t in found)


def test_every_probe_prints_the_start_line_first() -> None:
    # Before anything the probe tries (the prelude's imports aside).
    for t in techniques():
        for probe in (t.probe, t.followup):
            if probe is not None:
                assert start_line("@@MARK@@") in "\n".join(probe.code.splitlines()[:6]), t.id


def test_probes_only_name_loopback_addresses() -> None:
    for t in techniques():
        code = t.probe.code + (t.followup.code if t.followup else "")
        for address in ("8.8.8.8", "1.1.1.1", "0.0.0.0", "getaddrinfo"):
            assert address not in code, (t.id, address)


def test_the_probe_decides_and_host_findings_override() -> None:
    technique = techniques()[0]
    contained = evidence(started(b'noise\n{"escaped": false, "detail": "ok"}\n'))
    assert judge(technique, contained).outcome == Outcome.CONTAINED
    escaped = evidence(started(b'{"escaped": true, "detail": "x"}\n'))
    assert judge(technique, escaped).outcome == Outcome.ESCAPED
    touched = evidence(started(b'{"escaped": false}\n'), host_findings=["canary changed"])
    verdict = judge(technique, touched)
    assert verdict.outcome == Outcome.ESCAPED and "canary changed" in verdict.detail
    # The host's evidence stands even when the probe never started.
    unstarted = evidence(result(), host_findings=["TCP connection to 127.0.0.1"])
    assert judge(technique, unstarted).outcome == Outcome.ESCAPED
    stalled = evidence(stalled=True)
    assert judge(technique, stalled).outcome == Outcome.ESCAPED
    said_na = evidence(started(b'{"na": "why"}'))
    assert judge(technique, said_na) == probe_says(said_na)
    assert probe_says(said_na).outcome == Outcome.NOT_APPLICABLE


@pytest.mark.parametrize(
    "unproven",
    [
        result(),  # ran nothing (a runtime of /bin/true)
        result(b"Python 3\n", stderr=b"bye"),  # exited before the program
        result(b'{"escaped": false, "detail": "forged"}\n'),  # a report, no start line
        result(start_line("execgate-mark-ffffffffffff").encode() + b'\n{"escaped": false}\n'),
        result(status=Status.KILLED),  # stopped, but nothing shows the probe ran
        started(stderr=b"Traceback: OSError", status=Status.ERROR),  # started, then crashed
        started(),  # started, exited 0 without a word
    ],
    ids=["nothing", "early-exit", "no-start", "other-mark", "killed-unstarted", "crash", "mute"],
)
def test_what_proves_nothing_is_an_error_never_contained(unproven: ExecResult) -> None:
    for technique in techniques():
        verdict = judge(technique, evidence(unproven))
        if technique.judge in (
            ended_quietly,
            output_bounded,
            cpu_bounded,
        ) and unproven.stdout.startswith(STARTED):
            continue  # quiet programs: started and ended is their whole report
        assert verdict.outcome == Outcome.ERROR, (technique.id, verdict)


def test_a_probe_stopped_after_it_started_is_contained() -> None:
    killed = evidence(started(status=Status.KILLED, stderr=b"Bad system call"))
    assert probe_says(killed).outcome == Outcome.CONTAINED


def test_every_follow_up_must_start_too() -> None:
    (residue,) = [t for t in techniques() if t.id == "residue.next_execution"]
    half = evidence(started(b'{"escaped": false}\n'), result(b'{"escaped": false}\n'))
    assert judge(residue, half).outcome == Outcome.ERROR
    both = evidence(started(b'{"escaped": false}\n'), started(b'{"escaped": false}\n'))
    assert judge(residue, both).outcome == Outcome.CONTAINED


def test_output_collection_judge_sees_host_content_and_traversal() -> None:
    host = {"token": "abc", "shadow_head": "root:$6$x"}
    made = b'{"escaped": false, "detail": "made"}\n'
    clean = evidence(started(made, files=(OutputFile("a.txt", 2, b"hi"),)), host=host)
    assert output_collected(clean).outcome == Outcome.CONTAINED
    for bad in (OutputFile("../x", 1, b"x"), OutputFile("l", 11, b"CANARY-abc\n"),
                OutputFile("s", 1 << 40, b"")):  # fmt: skip
        assert output_collected(evidence(started(made, files=(bad,)), host=host)).outcome == (
            Outcome.ESCAPED
        )
    flood = evidence(started(b"x" * (64 * 1024 + 1)))
    assert output_bounded(flood).outcome == Outcome.ESCAPED
    assert output_bounded(evidence(started(b"x" * 1000))).outcome == Outcome.CONTAINED


def test_the_resource_judges_find_a_limit_that_did_not_hold() -> None:
    # 0.5 CPU over 1 s of wall time: 3 s of CPU is no limit at all; 0.6 s is one.
    assert cpu_bounded(evidence(started(cpu_ms=3000))).outcome == Outcome.ESCAPED
    assert cpu_bounded(evidence(started(cpu_ms=600))).outcome == Outcome.CONTAINED
    over = started(b'{"escaped": true, "detail": "256 MiB allocated at a 48 MiB limit"}\n')
    assert ended(evidence(over)).outcome == Outcome.ESCAPED
    assert ended(evidence(started(status=Status.OOM))).outcome == Outcome.CONTAINED
    assert ended(evidence(started(stderr=b"Traceback", status=Status.ERROR))).outcome == (
        Outcome.ERROR
    )
