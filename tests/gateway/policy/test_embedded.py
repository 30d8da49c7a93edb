"""The embedded engine over real rego-cpp: shipped policy, broken policies, deadlines."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.policy.base import PolicyEngine, PolicyEngineError
from gateway.policy.embedded import EmbeddedEngine
from tests.policies.inputs import base_input, patched

POLICIES = Path(__file__).resolve().parents[3] / "policies"
# Generous: only the deadline tests use a short one, against a policy that is
# thousands of times slower than it.
TIMEOUT_MS = 10_000


@pytest.fixture
async def engine() -> AsyncIterator[EmbeddedEngine]:
    engine = EmbeddedEngine(POLICIES, timeout_ms=TIMEOUT_MS)
    await engine.start()
    yield engine
    await engine.close()


def write_policy(directory: Path, source: str, name: str = "policy.rego") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(source, encoding="utf-8")
    return directory


async def start_error(path: Path, **kwargs: object) -> PolicyEngineError:
    engine = EmbeddedEngine(path, timeout_ms=TIMEOUT_MS, **kwargs)  # type: ignore[arg-type]
    with pytest.raises(PolicyEngineError) as info:
        await engine.start()
    await engine.close()
    return info.value


async def decide_error(engine: EmbeddedEngine, doc: dict) -> PolicyEngineError:
    with pytest.raises(PolicyEngineError) as info:
        await engine.decide(doc)
    return info.value


async def value(engine: EmbeddedEngine, doc: dict) -> dict:
    answer = await engine.decide(doc)
    assert answer.revision == engine.revision and answer.engine_decision_id is None
    return answer.value


# --- the shipped policy -------------------------------------------------------


async def test_compiles_shipped_policy(engine: EmbeddedEngine) -> None:
    assert isinstance(engine, PolicyEngine)
    assert len(engine.revision) == 64
    healthy, detail = await engine.health()
    assert healthy, detail
    assert engine.revision[:12] in detail


async def test_typical_allow(engine: EmbeddedEngine) -> None:
    assert await value(engine, base_input()) == {
        "allow": True,
        "deny": [],
        "require_approval": False,
        "obligations": {
            "timeout_s": 5,
            "memory_mb": 256,
            "cpus": 1.5,
            "pids": 64,
            "disk_mb": 64,
            "output_bytes": 1048576,
            "egress": [],
        },
        "monitor": [],
    }


async def test_egress_without_scope_denied_with_reason(engine: EmbeddedEngine) -> None:
    decision = await value(engine, patched(execution={"egress": ["api.example.com:443"]}))
    assert decision["allow"] is False
    assert decision["deny"] == ["network egress to api.example.com:443 needs scope net:egress"]


async def test_egress_with_scope_becomes_obligation(engine: EmbeddedEngine) -> None:
    decision = await value(
        engine,
        patched(
            execution={"egress": ["api.example.com:443"]},
            subject={"scopes": ["exec:python", "net:egress"]},
        ),
    )
    assert decision["allow"] is True
    assert decision["obligations"]["egress"] == ["api.example.com:443"]


async def test_missing_scope_denied(engine: EmbeddedEngine) -> None:
    decision = await value(engine, patched(subject={"scopes": ["exec:bash"]}))
    assert decision["allow"] is False
    assert decision["deny"] == ["subject lacks scope exec:python"]


async def test_limits_clamped_to_ceilings(engine: EmbeddedEngine) -> None:
    decision = await value(
        engine, patched(execution={"limits": {"timeout_s": 300, "memory_mb": 4096, "pids": 9}})
    )
    assert decision["allow"] is True
    obligations = decision["obligations"]
    assert (obligations["timeout_s"], obligations["memory_mb"], obligations["pids"]) == (30, 512, 9)


async def test_native_code_needs_approval(engine: EmbeddedEngine) -> None:
    native = {"imports": ["ctypes"], "features": ["native_code"]}
    decision = await value(engine, patched(analysis=native))
    assert decision["allow"] is False
    assert decision["require_approval"] is True
    assert decision["approval"] == {
        "reason": "python code for tenant acme loads native code (ctypes)",
        "ttl_s": 900,
    }
    approved = await value(
        engine,
        patched(
            analysis=native,
            approval={
                "present": True,
                "id": "apr_1",
                "code_sha256_match": True,
                "request_match": True,
            },
        ),
    )
    assert approved["allow"] is True and approved["require_approval"] is False


async def test_hostile_strings_round_trip(engine: EmbeddedEngine) -> None:
    language = 'py"th\\on\n\u00e9\u20ac\U0001f600\u0000'
    decision = await value(engine, patched(execution={"language": language, "code": "\x00\ud800"}))
    assert decision["deny"] == [
        f"language {language} is not allowed for tenant acme",
        f"subject lacks scope exec:{language}",
    ]


async def test_input_that_is_not_json_is_invalid(engine: EmbeddedEngine) -> None:
    error = await decide_error(engine, patched(execution={"limits": {"cpus": math.nan}}))
    assert error.kind == "invalid"
    error = await decide_error(engine, patched(execution={"egress": {1, 2}}))
    assert error.kind == "invalid"


async def test_concurrent_decisions_are_each_correct(engine: EmbeddedEngine) -> None:
    docs = [
        patched(execution={"limits": {"pids": 1 + i % 60}}, subject={"scopes": ["exec:python"]})
        if i % 2
        else patched(subject={"scopes": [f"exec:lang{i}"]})
        for i in range(200)
    ]
    decisions = await asyncio.gather(*(value(engine, doc) for doc in docs))
    for i, decision in enumerate(decisions):
        if i % 2:
            assert decision["allow"] is True
            assert decision["obligations"]["pids"] == 1 + i % 60
        else:
            assert decision["deny"] == ["subject lacks scope exec:python"]


async def test_revision_is_a_content_hash(tmp_path: Path) -> None:
    source = 'package execgate\nimport rego.v1\ndecision := {"allow": true}\n'

    async def revision(directory: Path, text: str, test_file: str) -> str:
        write_policy(directory, text)
        (directory / "x_test.rego").write_text(test_file)
        engine = EmbeddedEngine(directory, timeout_ms=TIMEOUT_MS)
        await engine.start()
        await engine.close()
        return engine.revision

    first = await revision(tmp_path / "a", source, "package t\n")
    # Test files do not count; the same modules elsewhere hash the same.
    same = await revision(tmp_path / "b", source, "package t\n# other\n")
    changed = await revision(tmp_path / "c", source + "# changed\n", "package t\n")
    assert first == same != changed


async def test_data_json_is_loaded_at_its_directory(tmp_path: Path) -> None:
    write_policy(
        tmp_path,
        'package execgate\nimport rego.v1\ndecision := {"n": data.cfg.n, "m": data.top, '
        '"l": data.list[1]}\n',
    )
    (tmp_path / "data.json").write_text(json.dumps({"top": "t"}))
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "data.json").write_text(json.dumps({"n": 7}))
    (tmp_path / "list").mkdir()
    (tmp_path / "list" / "data.json").write_text("[1, 2]")
    engine = EmbeddedEngine(tmp_path, timeout_ms=TIMEOUT_MS)
    await engine.start()
    try:
        assert await value(engine, {}) == {"n": 7, "m": "t", "l": 2}
    finally:
        await engine.close()


# --- broken policies fail at start-up or fail closed --------------------------


async def test_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    write_policy(tmp_path, "package execgate\n\ndecision := {\n", name="broken.rego")
    error = await start_error(tmp_path)
    assert error.kind == "invalid"
    assert f"{tmp_path / 'broken.rego'}:3:" in str(error)


async def test_unknown_function_fails_at_start(tmp_path: Path) -> None:
    write_policy(tmp_path, "package execgate\nimport rego.v1\ndecision := nosuch(1)\n")
    error = await start_error(tmp_path)
    assert "nosuch" in str(error)


async def test_policy_that_crashes_rego_cpp_fails_at_start(tmp_path: Path) -> None:
    # rego-cpp 1.5 segfaults compiling this; the preflight child takes the crash.
    write_policy(
        tmp_path,
        "package execgate\nimport rego.v1\nbad if input.x > 1\n"
        'decision := {"allow": bad} if bad with input as {"x": 2}\n',
    )
    error = await start_error(tmp_path)
    assert error.kind == "invalid"
    assert "crashed" in str(error)


GOOD = b"package execgate\ndecision := {}\n"


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"README.md": b"no modules here"}, "no policy modules"),
        ({"p.rego": GOOD, "data.json": b"{not json"}, "invalid JSON"),
        ({"p.rego": GOOD, "data.json": b"[1]"}, "must be an object"),
        ({"p.rego": b"package execgate\n# \xff\n"}, "unreadable"),
    ],
)
async def test_unusable_policy_directory(
    tmp_path: Path, files: dict[str, bytes], expected: str
) -> None:
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
    error = await start_error(tmp_path)
    assert error.kind == "invalid"
    assert expected in str(error)


async def test_missing_directory(tmp_path: Path) -> None:
    error = await start_error(tmp_path / "nowhere")
    assert "not found" in str(error)


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ("decision := 1 if input.nope", "undefined"),
        ('decision := "allow"', "a string"),
        ("decision := [true]", "an array"),
        ("decision := true", "a boolean"),
        (
            'decision := 1 if input.request.tool_name == "run_code"\n'
            'decision := 2 if input.request.tool_name == "run_code"',
            "multiple outputs",
        ),
    ],
)
async def test_unusable_decision_is_invalid(tmp_path: Path, rule: str, expected: str) -> None:
    write_policy(tmp_path, f"package execgate\nimport rego.v1\n{rule}\n")
    engine = EmbeddedEngine(tmp_path, timeout_ms=TIMEOUT_MS)
    await engine.start()
    try:
        error = await decide_error(engine, base_input())
    finally:
        await engine.close()
    assert error.kind == "invalid"
    assert expected in str(error)


async def test_restart_swaps_only_a_good_policy(tmp_path: Path) -> None:
    write_policy(tmp_path, 'package execgate\nimport rego.v1\ndecision := {"v": 1}\n')
    engine = EmbeddedEngine(tmp_path, timeout_ms=TIMEOUT_MS)
    await engine.start()
    try:
        first = engine.revision
        write_policy(tmp_path, "package execgate\ndecision := {\n")
        await start_error_on(engine)
        assert engine.revision == first
        assert await value(engine, {}) == {"v": 1}
        write_policy(tmp_path, 'package execgate\nimport rego.v1\ndecision := {"v": 2}\n')
        await engine.start()
        assert engine.revision != first
        assert await value(engine, {}) == {"v": 2}
    finally:
        await engine.close()


async def start_error_on(engine: EmbeddedEngine) -> None:
    with pytest.raises(PolicyEngineError):
        await engine.start()


async def test_not_started_and_closed_are_unavailable(tmp_path: Path) -> None:
    engine = EmbeddedEngine(POLICIES, timeout_ms=TIMEOUT_MS)
    assert (await decide_error(engine, base_input())).kind == "unavailable"
    assert (await engine.health())[0] is False
    await engine.start()
    await engine.close()
    assert (await decide_error(engine, base_input())).kind == "unavailable"
    assert (await engine.health())[0] is False


# --- deadlines ----------------------------------------------------------------

# count() over numbers.range(1, n): microseconds for small n, seconds for 300k.
SLOW_POLICY = (
    "package execgate\nimport rego.v1\n"
    'decision := {"n": count([x | some x in numbers.range(1, object.get(input, "n", 1))])}\n'
)
SLOW_N = 300_000


async def test_slow_policy_times_out_and_does_not_wedge(tmp_path: Path) -> None:
    engine = EmbeddedEngine(write_policy(tmp_path, SLOW_POLICY), timeout_ms=50)
    await engine.start()
    try:
        error = await decide_error(engine, {"n": SLOW_N})
        assert error.kind == "unavailable"
        assert "50 ms" in str(error)
        # The stuck evaluation runs on; later requests get a fresh thread.
        assert engine.overdue_evaluations == 1
        assert await value(engine, {"n": 3}) == {"n": 3}
        assert (await engine.health())[0] is True
        await engine.wait_overdue()
        assert engine.overdue_evaluations == 0
    finally:
        await engine.close()


async def test_too_many_overdue_evaluations_refuse_until_they_finish(tmp_path: Path) -> None:
    engine = EmbeddedEngine(write_policy(tmp_path, SLOW_POLICY), timeout_ms=50, max_overdue=1)
    await engine.start()
    try:
        await decide_error(engine, {"n": SLOW_N})
        error = await decide_error(engine, {"n": 3})
        assert error.kind == "unavailable"
        assert "still running" in str(error)
        healthy, detail = await engine.health()
        assert not healthy and "still running" in detail
        await engine.wait_overdue()
        assert engine.overdue_evaluations == 0
        assert await value(engine, {"n": 3}) == {"n": 3}
    finally:
        await engine.close()


async def test_deep_decision_fails_closed(tmp_path: Path) -> None:
    """The engine's output is read by the one decoder too: past the bound, no decision."""
    deep = "[" * 200 + "1" + "]" * 200
    rego = (
        "package execgate\nimport rego.v1\n"
        f'decision := {{"allow": true, "x": {deep}}} if input.deep\n'
        'decision := {"allow": true} if not input.deep\n'
    )
    engine = EmbeddedEngine(write_policy(tmp_path / "p", rego), timeout_ms=TIMEOUT_MS)
    await engine.start()
    try:
        assert (await engine.decide(base_input())).value == {"allow": True}
        error = await decide_error(engine, {**base_input(), "deep": True})
    finally:
        await engine.close()
    assert error.kind == "invalid" and "nested deeper" in error.message
    start = await start_error(write_policy(tmp_path / "q", rego.replace("input.deep", "true")))
    assert "nested deeper" in start.message
