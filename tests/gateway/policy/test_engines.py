"""The same cases through both engines: embedded rego-cpp and a real OPA server.

Every test here runs twice (the `engine` fixture is parametrised), against the
shipped policy, and states the expected decision, so the two engines are held
to one answer, not merely to each other's.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gateway.policy.base import EngineAnswer, PolicyEngine, PolicyEngineError
from gateway.policy.embedded import EmbeddedEngine
from gateway.policy.opa import OpaEngine
from gateway.policy.sources import load_sources
from tests.gateway.policy.conftest import embedded_engine
from tests.policies.inputs import base_input, corpus, patched
from tests.policies.opa_server import POLICIES

NET = ["exec:python", "exec:bash", "net:egress"]
TYPICAL_OBLIGATIONS = {
    "timeout_s": 5,
    "memory_mb": 256,
    "cpus": 1.5,
    "pids": 64,
    "disk_mb": 64,
    "output_bytes": 1048576,
    "egress": [],
}

TOOL_EXEC = {"language": "tool", "code": '{"text":"hi"}', "backend": None, "limits": {}}


def tool(name: str) -> dict[str, Any]:
    return {"name": name, "server": "upstream", "arguments": {"text": "hi"}}


# (id, input, the decision's keys that must have exactly these values)
CASES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    (
        "typical-allow",
        base_input(),
        {"allow": True, "deny": [], "obligations": TYPICAL_OBLIGATIONS, "monitor": []},
    ),
    (
        "missing-scope",
        patched(subject={"scopes": ["exec:bash"]}),
        {"allow": False, "deny": ["subject lacks scope exec:python"]},
    ),
    (
        "egress-without-scope",
        patched(execution={"egress": ["api.example.com:443"]}),
        {"deny": ["network egress to api.example.com:443 needs scope net:egress"]},
    ),
    (
        "egress-allowlisted",
        patched(
            execution={"egress": ["api.example.com:443", "x.example.org:443"]},
            subject={"scopes": NET},
        ),
        {"allow": True},
    ),
    (
        "egress-off-allowlist",
        patched(execution={"egress": ["evil.example:443"]}, subject={"scopes": NET}),
        {"deny": ["network egress to evil.example:443 is not on the allowlist of tenant acme"]},
    ),
    (
        "limits-clamped",
        patched(execution={"limits": {"timeout_s": 300, "memory_mb": 4096, "pids": 9}}),
        {"allow": True},
    ),
    (
        "tier-ceiling",
        patched(subject={"claims": {"tier": "free"}}),
        {"allow": True, "obligations": {**TYPICAL_OBLIGATIONS, "timeout_s": 5, "memory_mb": 128}},
    ),
    (
        "native-code-approval",
        patched(analysis={"imports": ["ctypes"], "features": ["native_code"]}),
        {
            "allow": False,
            "require_approval": True,
            "approval": {
                "reason": "python code for tenant acme loads native code (ctypes)",
                "ttl_s": 900,
            },
        },
    ),
    (
        "approved",
        patched(
            analysis={"imports": ["ctypes"], "features": ["native_code"]},
            approval={
                "present": True,
                "id": "apr_1",
                "code_sha256_match": True,
                "request_match": True,
            },
        ),
        {"allow": True, "require_approval": False},
    ),
    (
        "initech-blocked-import-and-backend",
        patched(tenant={"id": "initech"}, analysis={"imports": ["socket"]}),
        {
            "deny": [
                "python code for tenant initech imports socket, which the tenant's policy blocks"
            ]
        },
    ),
    (
        "initech-bash-approval",
        patched(tenant={"id": "initech"}, execution={"language": "bash"}),
        {"require_approval": True},
    ),
    (
        "monitor-only",
        patched(analysis={"calls": ["eval"], "features": ["dynamic_code"]}),
        {"allow": True, "monitor": ["would deny under draft rule: dynamic_code"]},
    ),
    (
        "empty-input",
        {},
        {"allow": False, "obligations": {"egress": []}},
    ),
    # Guarded upstream tools (policies/tools.rego): language "tool" and a `tool` object.
    (
        "tool-allowed",
        patched(execution=TOOL_EXEC, subject={"scopes": ["tool:echo"]}, tool=tool("echo")),
        {"allow": True, "deny": []},
    ),
    (
        "tool-without-scope",
        patched(execution=TOOL_EXEC, subject={"scopes": ["exec:python"]}, tool=tool("echo")),
        {"allow": False, "deny": ["subject lacks scope tool:echo"]},
    ),
    (
        "tool-not-listed",
        patched(
            execution=TOOL_EXEC,
            subject={"scopes": ["tool:*"]},
            tenant={"id": "initech"},
            tool=tool("send_email"),
        ),
        {"allow": False, "deny": ["tool send_email is not allowed for tenant initech"]},
    ),
    (
        "tool-needs-approval",
        patched(
            execution=TOOL_EXEC,
            subject={"scopes": ["tool:send_email"]},
            tenant={"id": "globex"},
            tool=tool("send_email"),
        ),
        {"allow": False, "deny": [], "require_approval": True},
    ),
]


@pytest.mark.parametrize(("doc", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
async def test_expected_decision(
    engine: PolicyEngine, doc: dict[str, Any], expected: dict[str, Any]
) -> None:
    answer = await engine.decide(doc)
    assert isinstance(answer, EngineAnswer)
    assert {k: answer.value.get(k) for k in expected} == expected


async def test_revision_is_the_same_content_hash(engine: PolicyEngine) -> None:
    healthy, detail = await engine.health()
    assert healthy, detail
    expected = load_sources(POLICIES).revision
    assert engine.revision == expected
    assert (await engine.decide(base_input())).revision == expected


async def test_only_opa_names_its_decisions(engine: PolicyEngine) -> None:
    first, second = await engine.decide(base_input()), await engine.decide(base_input())
    if not isinstance(engine, OpaEngine):
        assert first.engine_decision_id is None
    else:
        assert first.engine_decision_id and second.engine_decision_id
        assert first.engine_decision_id != second.engine_decision_id


async def test_corpus_decides_identically(engine: PolicyEngine) -> None:
    # The same corpus the OPA CLI comparison uses; here through each engine's API.
    reference = EmbeddedEngine(POLICIES, timeout_ms=10_000)
    await reference.start()
    try:
        for doc in corpus():
            assert (await engine.decide(doc)).value == (await reference.decide(doc)).value, doc
    finally:
        await reference.close()


async def test_hostile_strings_round_trip(engine: PolicyEngine) -> None:
    language = 'py"th\\on\n\u00e9\u20ac\U0001f600\u0000'
    answer = await engine.decide(patched(execution={"language": language, "code": "\x00\ud800"}))
    assert answer.value["deny"] == [
        f"language {language} is not allowed for tenant acme",
        f"subject lacks scope exec:{language}",
    ]


async def test_input_that_is_not_json_is_invalid(engine: PolicyEngine) -> None:
    with pytest.raises(PolicyEngineError) as info:
        await engine.decide(patched(execution={"limits": {"cpus": float("nan")}}))
    assert info.value.kind == "invalid"


async def test_concurrent_decisions_are_each_correct(engine: PolicyEngine) -> None:
    docs = [patched(execution={"limits": {"pids": 1 + i % 60}}) for i in range(100)]
    answers = await asyncio.gather(*(engine.decide(doc) for doc in docs))
    assert [a.value["obligations"]["pids"] for a in answers] == [1 + i % 60 for i in range(100)]


async def test_closed_engine_is_unavailable(engine: PolicyEngine) -> None:
    await engine.close()
    with pytest.raises(PolicyEngineError) as info:
        await engine.decide(base_input())
    assert info.value.kind == "unavailable"
    assert (await engine.health())[0] is False


def _review_doc(**behaviour: Any) -> dict[str, Any]:
    record = {"capture": "on", "files": [], "programs": [], "signals": [],
              "syscalls_refused": {}, "dropped": 0, **behaviour}  # fmt: skip
    return {
        "version": "execgate.review/v1",
        "execution": {
            "id": "exe_1",
            "language": "python",
            "backend": "nsjail",
            "status": "ok",
            "exit_code": 0,
        },
        "subject": {"sub": "agent", "tenant": "acme"},
        "behaviour": record,
        "network": [],
    }


async def test_review_flags_what_the_shipped_rules_name(engine: PolicyEngine) -> None:
    shadow = {"op": "open", "path": "/etc/shadow", "result": "EACCES", "count": 1}
    answer = await engine.review(_review_doc(files=[shadow], syscalls_refused={"mount": 1}))
    assert answer is not None
    assert sorted(f["rule"] for f in answer["flags"]) == ["credential_path", "privileged_syscall"]
    assert await engine.review(_review_doc()) == {"flags": []}


async def test_a_policy_without_review_answers_none(tmp_path: Any, own_opa: Any) -> None:
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "p.rego").write_text(
        'package execgate\n\nimport rego.v1\n\ndecision := {"allow": true}\n', encoding="utf-8"
    )
    server = own_opa(policy)
    for built in (
        embedded_engine("embedded", policy),
        embedded_engine("rego-cpp", policy),
        OpaEngine(server.url, timeout_ms=5000),
    ):
        await built.start()
        try:
            assert (await built.decide(base_input())).value == {"allow": True}
            assert await built.review(_review_doc()) is None
        finally:
            await built.close()
