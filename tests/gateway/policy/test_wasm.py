"""The embedded OPA Wasm engine: compile errors, deadlines it enforces, bounded memory."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.policy.base import PolicyEngineError
from gateway.policy.compiler import OpaNotFound, find_opa_binary
from gateway.policy.mask import LogMask
from gateway.policy.wasm import WasmEngine
from tests.gateway.policy.conftest import TIMEOUT_MS, write_policy
from tests.policies.inputs import base_input
from tests.policies.opa_server import POLICIES


async def started(path: Path, opa_bin: str, timeout_ms: int = TIMEOUT_MS) -> WasmEngine:
    engine = WasmEngine(path, timeout_ms=timeout_ms, opa_bin=opa_bin)
    await engine.start()
    return engine


@pytest.fixture
async def shipped(opa_bin: str) -> AsyncIterator[WasmEngine]:
    engine = await started(POLICIES, opa_bin)
    yield engine
    await engine.close()


async def start_error(path: Path, opa_bin: str) -> PolicyEngineError:
    engine = WasmEngine(path, timeout_ms=TIMEOUT_MS, opa_bin=opa_bin)
    with pytest.raises(PolicyEngineError) as info:
        await engine.start()
    await engine.close()
    return info.value


# --- broken policies: refused at start-up, in OPA's words, naming the file -----


async def test_syntax_error_names_the_operators_file(tmp_path: Path, opa_bin: str) -> None:
    write_policy(tmp_path, "package execgate\n\ndecision := {\n", name="broken.rego")
    error = await start_error(tmp_path, opa_bin)
    assert error.kind == "invalid"
    # OPA names the line it stopped at (the end of the file here).
    assert f"{tmp_path / 'broken.rego'}:4: rego_parse_error" in error.message
    assert "execgate-policy-" not in error.message  # not the private build copy


async def test_unknown_function_fails_at_start(tmp_path: Path, opa_bin: str) -> None:
    write_policy(tmp_path, "package execgate\nimport rego.v1\ndecision := nosuch(1)\n")
    error = await start_error(tmp_path, opa_bin)
    assert error.kind == "invalid" and "nosuch" in error.message


async def test_builtin_the_host_lacks_is_refused_at_start(tmp_path: Path, opa_bin: str) -> None:
    # time.now_ns is left to the host by OPA's Wasm target, and this host has none.
    write_policy(tmp_path, 'package execgate\nimport rego.v1\ndecision := {"t": time.now_ns()}\n')
    error = await start_error(tmp_path, opa_bin)
    assert error.kind == "invalid"
    assert "time.now_ns" in error.message and 'policy.engine = "opa"' in error.message


@pytest.mark.parametrize(
    ("rule", "expected"),
    [
        ("decision := 1 if input.nope", "undefined"),
        ('decision := "allow"', "a string"),
        ("decision := [true]", "an array"),
        (
            'decision := 1 if input.request.tool_name == "run_code"\n'
            'decision := 2 if input.request.tool_name == "run_code"',
            "conflict",
        ),
    ],
)
async def test_unusable_decision_is_invalid(
    tmp_path: Path, opa_bin: str, rule: str, expected: str
) -> None:
    engine = await started(
        write_policy(tmp_path, f"package execgate\nimport rego.v1\n{rule}\n"), opa_bin
    )
    try:
        with pytest.raises(PolicyEngineError) as info:
            await engine.decide(base_input())
        assert info.value.kind == "invalid" and expected in info.value.message
        # An evaluation error leaves the engine usable.
        assert (await engine.health())[0] is True
    finally:
        await engine.close()


# --- deadlines: a runaway evaluation is stopped, not abandoned ------------------

# Hostile policies, one per way an evaluation runs away: a comprehension over a
# huge range, a nested one (quadratic), and a walk of a big generated value.
RUNAWAY = {
    "range": 'count([x | some x in numbers.range(1, object.get(input, "n", 1))])',
    "nested": 'count([1 | some x in numbers.range(1, object.get(input, "n", 1)); '
    'some y in numbers.range(1, object.get(input, "n", 1))])',
    "walk": 'count([p | walk(numbers.range(1, object.get(input, "n", 1)), [p, _])])',
}
# Each one's answer for n = 3.
SMALL = {"range": 3, "nested": 9, "walk": 4}


@pytest.mark.parametrize("kind", sorted(RUNAWAY))
async def test_runaway_evaluation_is_interrupted_at_the_deadline(
    tmp_path: Path, opa_bin: str, kind: str
) -> None:
    source = f'package execgate\nimport rego.v1\ndecision := {{"n": {RUNAWAY[kind]}}}\n'
    engine = await started(write_policy(tmp_path, source), opa_bin, timeout_ms=100)
    try:
        assert (await engine.decide({"n": 3})).value["n"] == SMALL[kind]
        with pytest.raises(PolicyEngineError) as info:
            await engine.decide({"n": 50_000_000})
        assert info.value.kind == "unavailable"
        assert "within 100 ms" in info.value.message or "memory" in info.value.message
        # Nothing keeps running: the next decisions and the probe are served at once.
        assert (await engine.decide({"n": 3})).value["n"] == SMALL[kind]
        assert (await engine.health())[0] is True
        assert engine.interrupted_evaluations + ("memory" in info.value.message) == 1
    finally:
        await engine.close()


async def test_memory_explosion_fails_closed_and_memory_comes_back(
    tmp_path: Path, opa_bin: str
) -> None:
    # Strings that double: memory, not time, runs out first (10 s deadline).
    source = (
        "package execgate\nimport rego.v1\n"
        'decision := {"n": count(concat("", [s | some i in '
        'numbers.range(1, object.get(input, "n", 1)); s := sprintf("%v", [i])]))}\n'
    )
    engine = await started(write_policy(tmp_path, source), opa_bin)
    try:
        with pytest.raises(PolicyEngineError) as info:
            await engine.decide({"n": 100_000_000})
        assert info.value.kind == "unavailable"
        assert (await engine.decide({"n": 10})).value == {"n": 11}
    finally:
        await engine.close()


async def test_an_evaluation_that_grows_memory_is_answered_from_where_it_moved(
    tmp_path: Path, opa_bin: str
) -> None:
    # The module's own allocations grow (and may move) its linear memory in the
    # middle of an evaluation; the answer is read after it, from where it is now.
    source = (
        "package execgate\nimport rego.v1\n"
        'decision := {"n": count(concat("", [s | some i in '
        'numbers.range(1, object.get(input, "n", 1)); s := sprintf("%v", [i])])), '
        '"tag": object.get(input, "tag", "")}\n'
    )
    engine = await started(write_policy(tmp_path, source), opa_bin)
    try:
        policy = engine._policy
        assert policy is not None
        before = policy._memory.data_len(policy._store)
        # Grown and kept (under 4x its start-up size), then grown past it and rebuilt.
        assert (await engine.decide({"n": 1_000, "tag": "kept"})).value == {
            "n": 2_893,
            "tag": "kept",
        }
        assert policy._memory.data_len(policy._store) > before
        assert (await engine.decide({"n": 30_000, "tag": "big"})).value == {
            "n": 138_894,
            "tag": "big",
        }
        for n in (3, 1_000, 5, 30_000, 2):
            tag = f"after-{n}"
            assert (await engine.decide({"n": n, "tag": tag})).value["tag"] == tag
    finally:
        await engine.close()


async def test_memory_stays_bounded_over_many_decisions(shipped: WasmEngine) -> None:
    policy = shipped._policy
    assert policy is not None
    big = base_input()
    big["execution"]["code"] = "x" * 900_000
    for _ in range(3):
        await shipped.decide(big)
    for _ in range(2000):
        await shipped.decide(base_input())
    after = shipped._policy
    assert after is not None
    # The heap is reset per decision: memory never grows past its start-up size
    # plus one big input (a bigger one gets a fresh instance afterwards).
    assert after._memory.data_len(after._store) <= after._initial_bytes * 4


async def test_decisions_run_concurrently_and_each_is_right(shipped: WasmEngine) -> None:
    docs = []
    for i in range(300):
        doc = base_input()
        doc["execution"]["limits"] = {"pids": 1 + i % 60}
        docs.append(doc)
    answers = await asyncio.gather(*(shipped.decide(doc) for doc in docs))
    assert [a.value["obligations"]["pids"] for a in answers] == [1 + i % 60 for i in range(300)]


# --- the compiler: found, or a clear error ------------------------------------


def test_missing_opa_names_what_to_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXECGATE_OPA_BIN", str(tmp_path / "nope"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(OpaNotFound) as info:
        find_opa_binary(str(tmp_path / "also-nope"))
    assert "make opa" in info.value.message and "policy.opa_bin" in info.value.message


def test_opa_is_found_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "opa"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    monkeypatch.setenv("EXECGATE_OPA_BIN", "")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert find_opa_binary("") == str(fake)
    configured = tmp_path / "configured-opa"
    configured.write_text("#!/bin/sh\n")
    configured.chmod(0o755)
    assert find_opa_binary(str(configured)) == str(configured)
    monkeypatch.setenv("EXECGATE_OPA_BIN", str(fake))
    assert find_opa_binary(str(configured)) == str(fake)
    assert os.access(fake, os.X_OK)


async def test_compiled_revision_is_the_reported_one(tmp_path: Path, opa_bin: str) -> None:
    directory = write_policy(tmp_path, 'package execgate\nimport rego.v1\ndecision := {"v": 1}\n')
    (directory / "data.json").write_text(json.dumps({"k": 1}))
    engine = await started(directory, opa_bin)
    try:
        answer = await engine.decide({})
        assert answer.value == {"v": 1} and answer.revision == engine.revision
    finally:
        await engine.close()


async def test_public_call_path_decides_the_same(shipped: WasmEngine) -> None:
    # The prepared C call falls back to wasmtime-py's public call on another layout.
    fast = (await shipped.decide(base_input())).value
    policy = shipped._policy
    assert policy is not None and policy._eval._fast
    policy._eval._fast = False
    assert (await shipped.decide(base_input())).value == fast


# --- the decision-log mask, answered in-process ---------------------------------


async def test_mask_is_answered_as_the_log_masks_it(shipped: WasmEngine) -> None:
    # The same pointers as the rego-cpp evaluator of the same file, for claims whose
    # name or value looks like a secret, and names that need JSON-pointer escapes.
    mask = LogMask(POLICIES)
    claims_cases: list[dict[str, object]] = [
        {},
        {"team": "a", "api_key": "x"},
        {"plain": "Bearer abc", "n": 3, "sessionId": ["x"]},
        {"a/b~c token": "v", "ok": "eyJhbGciOi.x"},
    ]
    for claims in claims_cases:
        entry = {"input": {**base_input(), "subject": {"claims": claims}}, "result": {}}
        assert shipped.mask_pointers(entry) == mask.pointers(entry), claims


async def test_mask_is_answered_off_the_loop_while_the_loop_decides(
    shipped: WasmEngine,
) -> None:
    # The decision-input log's writer asks for the mask on its own threads while the
    # event loop keeps deciding: the mask has its own instance, so neither sees the
    # other's input (one shared instance would interleave their heaps).
    mask = LogMask(POLICIES)
    entries = [
        {"input": {**base_input(), "subject": {"claims": {f"token{i}": "v", "n": i}}},
         "result": {}}
        for i in range(8)
    ]  # fmt: skip
    expected = [mask.pointers(entry) for entry in entries]
    allowed = (await shipped.decide(base_input())).value

    def ask_many(entry: dict[str, object]) -> list[list[str] | None]:
        return [shipped.mask_pointers(entry) for _ in range(50)]

    askers = [asyncio.to_thread(ask_many, entry) for entry in entries]
    decisions = [shipped.decide(base_input()) for _ in range(200)]
    answers = await asyncio.gather(*askers, *decisions)
    for got, want in zip(answers[: len(entries)], expected, strict=True):
        assert got == [want] * 50
    assert all(a.value == allowed for a in answers[len(entries) :])


async def test_mask_follows_a_reload(tmp_path: Path, opa_bin: str) -> None:
    write_policy(tmp_path, 'package execgate\n\ndecision := {"allow": true}\n')
    (tmp_path / "system").mkdir()
    log_rego = tmp_path / "system" / "log.rego"
    log_rego.write_text('package system.log\n\nmask := {"/input/a"}\n')
    engine = await started(tmp_path, opa_bin)
    try:
        assert await asyncio.to_thread(engine.mask_pointers, {"input": {}}) == ["/input/a"]
        log_rego.write_text('package system.log\n\nmask := {"/input/b"}\n')
        await engine.start()
        assert await asyncio.to_thread(engine.mask_pointers, {"input": {}}) == ["/input/b"]
    finally:
        await engine.close()
    assert engine.mask_pointers({"input": {}}) is None  # closed: the log's evaluator


async def test_no_mask_rule_leaves_the_mask_to_the_log(tmp_path: Path, opa_bin: str) -> None:
    write_policy(tmp_path, 'package execgate\n\ndecision := {"allow": true}\n')
    engine = await started(tmp_path, opa_bin)
    try:
        assert engine.mask_pointers({"input": {}, "result": {}}) is None
    finally:
        await engine.close()
