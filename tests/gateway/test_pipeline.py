"""The pipeline without HTTP: its order, its records, and failing closed.

Unit tests: the token verifier and the policy engine are small fakes here; the real
ones are exercised end to end in tests/gateway/ingress/test_rest.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from backends.base import ExecResult, ExecSpec, pass_gate
from backends.capture.record import BehaviourRecorder
from backends.noop import NoopBackend
from gateway.admission.gate import Admission
from gateway.approvals.desk import ApprovalDesk
from gateway.approvals.records import ApprovalStore
from gateway.audit.log import AuditLog
from gateway.auth.jws import AuthError
from gateway.auth.tokens import Principal
from gateway.context import ExecContext
from gateway.decoders import decode_json_body
from gateway.errors import GatewayError
from gateway.executions.results import render_result
from gateway.executions.store import ExecutionStore
from gateway.pipeline import STAGES, Pipeline
from gateway.policy.base import EngineAnswer, PolicyEngineError
from gateway.services import Services
from gateway.settings.model import load_settings

ALLOW = {"allow": True, "deny": [], "obligations": {"egress": []}}
SECRET_TOKEN = "token-that-must-never-be-recorded"


class FakeVerifier:
    async def verify(self, token: str) -> Principal:
        if token != SECRET_TOKEN:
            raise AuthError("bad_signature")
        return Principal("agent", "acme", frozenset({"exec:python"}), {"sub": "agent"})


class FakeEngine:
    revision = "rev-test"

    def __init__(self) -> None:
        self.answer: Any = ALLOW
        self.inputs: list[dict[str, Any]] = []
        self.reviewed: list[dict[str, Any]] = []
        self.review_answer: dict[str, Any] | None = {"flags": []}

    async def decide(self, input: dict[str, Any]) -> EngineAnswer:
        self.inputs.append(input)
        if isinstance(self.answer, Exception):
            raise self.answer
        return EngineAnswer(self.answer, self.revision)

    async def review(self, input: dict[str, Any]) -> dict[str, Any] | None:
        self.reviewed.append(input)
        await asyncio.sleep(0)  # as the OPA server's answer does: other tasks run meanwhile
        return self.review_answer

    async def health(self) -> tuple[bool, str]:
        return True, ""


@pytest.fixture
async def svc(tmp_path: Path) -> AsyncIterator[Services]:
    settings = load_settings(None, env={"EXECGATE_BACKENDS_DEFAULT": "noop"})
    audit = AuditLog(tmp_path / "audit.jsonl")
    await audit.start()
    store = ExecutionStore(None)
    await store.start()
    settings.approvals.signing_key_file = str(tmp_path / "approval.pem")
    approvals = ApprovalStore(tmp_path / "state.db")
    await approvals.start()
    desk = ApprovalDesk(settings.approvals, approvals, audit, store)
    await desk.start()
    yield Services(
        settings=settings,
        verifier=FakeVerifier(),  # type: ignore[arg-type]
        engine=FakeEngine(),
        admission=Admission(),
        backends={"noop": NoopBackend()},
        audit=audit,
        store=store,
        approvals=desk,
    )
    await desk.close()
    await approvals.close()
    await audit.close()
    await store.close()


def context(body: dict[str, Any], token: str | None = SECRET_TOKEN) -> ExecContext:
    return ExecContext(
        ingress="rest",
        source_ip="127.0.0.1",
        bearer=token,
        payload=json.dumps(body).encode(),
        decode=decode_json_body,
    )


def records(svc: Services) -> list[dict[str, Any]]:
    return [json.loads(x) for x in Path(svc.audit.path).read_text().splitlines()]


def test_the_order_is_written_once() -> None:
    assert [s.__name__ for s in STAGES] == [
        "authenticate",
        "validate",
        "authorize",
        "analyse",
        "redeem_approval",
        "build_input",
        "decide",
        "hold_for_approval",
        "admit",
        "dispatch",
        "review",
    ]


async def test_allowed_request_runs_and_is_recorded(svc: Services) -> None:
    ctx = await Pipeline(svc).run(context({"language": "python", "code": "print(1)"}))
    assert ctx.result is not None and ctx.result.status.value == "ok"
    assert [r["type"] for r in records(svc)] == [
        "policy.decided",
        "execution.started",
        "execution.finished",
    ]
    assert ctx.bearer is None
    engine = svc.engine
    assert isinstance(engine, FakeEngine)
    policy_input = json.dumps(engine.inputs[0])
    assert SECRET_TOKEN not in policy_input and SECRET_TOKEN not in Path(svc.audit.path).read_text()
    assert engine.inputs[0]["execution"]["code_sha256"]
    assert engine.inputs[0]["analysis"]["calls"] == ["print"]


@pytest.mark.parametrize(
    ("answer", "code"),
    [
        (PolicyEngineError("unavailable", "engine down"), "policy_unavailable"),
        (PolicyEngineError("invalid", "undefined decision"), "policy_invalid"),
        ({"allow": True, "obligations": {"gpu": 1}}, "policy_invalid"),
        ({"allow": "yes"}, "policy_invalid"),
        (["allow"], "policy_invalid"),
        ({"allow": True, "deny": ["no"]}, "policy_denied"),
        ({"allow": False}, "policy_denied"),
        ({"allow": True, "obligations": {"backend": "docker-gvisor"}}, "backend_unavailable"),
        ({"allow": True, "obligations": {"egress": ["example.com:443"]}}, "backend_unavailable"),
    ],
)
async def test_no_clear_decision_runs_nothing(svc: Services, answer: Any, code: str) -> None:
    assert isinstance(svc.engine, FakeEngine)
    svc.engine.answer = answer
    with pytest.raises(GatewayError) as exc:
        await Pipeline(svc).run(context({"language": "python", "code": "print(1)"}))
    assert exc.value.code == code
    recorded = records(svc)
    assert recorded[-1]["type"] == "request.rejected" and recorded[-1]["code"] == code
    assert "execution.started" not in [r["type"] for r in recorded]


async def test_bad_token_is_recorded_as_auth_failed(svc: Services) -> None:
    with pytest.raises(GatewayError) as exc:
        await Pipeline(svc).run(context({"language": "python", "code": "1"}, token="forged"))
    assert exc.value.code == "unauthenticated"
    (record,) = records(svc)
    assert record["type"] == "auth.failed" and "forged" not in json.dumps(record)


async def test_concurrency_slot_is_released_after_the_run(svc: Services) -> None:
    for _ in range(10):
        await Pipeline(svc).run(context({"language": "python", "code": "1"}))
    usage = await svc.admission.usage("acme", svc.settings.tenant("acme"))
    assert usage["concurrent"] == 0


class TriedThings(NoopBackend):
    """A backend whose sandbox saw the code try a credential path and a mount."""

    async def run(self, spec: ExecSpec) -> ExecResult:
        result = await super().run(spec)
        recorder = BehaviourRecorder("test")
        recorder.file("open", "/etc/shadow", -13)
        recorder.refused("mount")
        return dataclasses.replace(result, behaviour=recorder.finish())


async def test_behaviour_reviewed_flagged_and_recorded_before_the_answer(svc: Services) -> None:
    svc.backends["noop"] = TriedThings()
    engine = svc.engine
    assert isinstance(engine, FakeEngine)
    engine.review_answer = {
        "flags": [
            {"rule": "shell", "severity": "low", "detail": "sh"},
            {"rule": "credential_path", "severity": "high", "detail": "open /etc/shadow"},
            {"rule": "odd", "severity": "catastrophic"},  # unknown severity: medium
            "not a flag",
        ]
    }
    ctx = await Pipeline(svc).run(context({"language": "python", "code": "print(1)"}))
    reviewed = engine.reviewed[0]
    assert reviewed["version"] == "execgate.review/v1"
    assert reviewed["behaviour"]["files"] == [
        {"op": "open", "path": "/etc/shadow", "result": "EACCES", "count": 1}
    ]
    assert "code" not in reviewed["execution"] and "print(1)" not in json.dumps(reviewed)
    assert SECRET_TOKEN not in json.dumps(reviewed)
    rendered = render_result(ctx)["behaviour"]
    assert [f["rule"] for f in rendered["flags"]] == ["credential_path", "odd", "shell"]
    assert rendered["flags"][1]["severity"] == "medium"
    assert "not an object" in rendered["review_error"]  # the bad entry is named, not hidden
    assert rendered["syscalls_refused"] == {"mount": 1}
    by_type = {r["type"]: r for r in records(svc)}
    assert by_type["execution.behaviour"]["files"][0]["path"] == "/etc/shadow"
    assert by_type["execution.review"]["flags"][0]["rule"] == "credential_path"
    assert by_type["execution.finished"]["capture"] == "on"
    stored = await svc.store.get(ctx.execution_id)
    assert stored is not None
    assert stored["result"]["behaviour"]["flags"] == rendered["flags"]


async def test_a_request_costs_two_fsyncs_whatever_it_records(svc: Services) -> None:
    """Its start before the hand-over, everything else before the answer: behaviour,
    review, attempts and the finish go in one batch (a record submitted on its own
    wakes the writer, and one made after an await could need a second fsync)."""
    svc.backends["noop"] = TriedThings()
    before = svc.audit.fsyncs
    await Pipeline(svc).run(context({"language": "python", "code": "print(1)"}))
    types = [r["type"] for r in records(svc)]
    assert {"execution.behaviour", "execution.review", "execution.finished"} <= set(types)
    assert svc.audit.fsyncs - before == 2


async def test_a_review_the_engine_cannot_answer_is_recorded_not_fatal(svc: Services) -> None:
    svc.backends["noop"] = TriedThings()
    engine = svc.engine
    assert isinstance(engine, FakeEngine)

    async def down(input: dict[str, Any]) -> dict[str, Any] | None:
        raise PolicyEngineError("unavailable", "engine down")

    engine.review = down  # type: ignore[method-assign]
    ctx = await Pipeline(svc).run(context({"language": "python", "code": "print(1)"}))
    assert ctx.result is not None and ctx.result.status.value == "ok"
    review = {r["type"]: r for r in records(svc)}["execution.review"]
    assert review["error"] == "unavailable: engine down" and review["flags"] == []


async def test_nothing_tried_nothing_asked(svc: Services) -> None:
    ctx = await Pipeline(svc).run(context({"language": "python", "code": "print(1)"}))
    engine = svc.engine
    assert isinstance(engine, FakeEngine)
    assert engine.reviewed == []
    behaviour = render_result(ctx)["behaviour"]
    assert behaviour["capture"] == "off" and "records no behaviour" in behaviour["reason"]
    assert "execution.review" not in {r["type"] for r in records(svc)}


class HandsOver(NoopBackend):
    """Notes, at the hand-over, what the audit log had made durable by then."""

    def __init__(self, durable: list[str]) -> None:
        super().__init__()
        self.durable = durable
        self.seen_at_hand_over: str | None = None
        self.asked = False

    async def run(self, spec: ExecSpec) -> ExecResult:
        self.asked = True
        await pass_gate(spec)
        self.seen_at_hand_over = self.durable[-1] if self.durable else ""
        return await super().run(dataclasses.replace(spec, gate=None))


async def audit_with(svc: Services, tmp_path: Path, fsync: Callable[[int], None]) -> AuditLog:
    await svc.audit.close()
    svc.audit = AuditLog(tmp_path / "gated.jsonl", fsync=fsync, retry_interval_s=60)
    await svc.audit.start()
    return svc.audit


async def test_code_is_handed_over_only_once_its_start_is_durable(
    svc: Services, tmp_path: Path
) -> None:
    durable: list[str] = []

    def fsync(fd: int) -> None:
        os.fsync(fd)
        durable.append((tmp_path / "gated.jsonl").read_text())

    await audit_with(svc, tmp_path, fsync)
    backend = svc.backends["noop"] = HandsOver(durable)
    ctx = await Pipeline(svc).run(context({"language": "python", "code": "print(1)"}))
    assert backend.seen_at_hand_over is not None
    started = [json.loads(line) for line in backend.seen_at_hand_over.splitlines()]
    assert [r["type"] for r in started][-1] == "execution.started"
    assert started[-1]["execution_id"] == ctx.execution_id
    assert ctx.running.is_set()


async def test_a_start_that_cannot_be_recorded_runs_nothing(svc: Services, tmp_path: Path) -> None:
    def fsync(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    await audit_with(svc, tmp_path, fsync)
    backend = svc.backends["noop"] = HandsOver([])
    ctx = context({"language": "python", "code": "print(1)"})
    with pytest.raises(GatewayError) as caught:
        await Pipeline(svc).run(ctx)
    assert caught.value.code == "audit_unavailable"
    assert backend.asked  # the sandbox was being made ready meanwhile
    assert backend.seen_at_hand_over is None  # the gate never passed: nothing ran
    assert not ctx.running.is_set()
    assert await svc.store.get(ctx.execution_id) is None
