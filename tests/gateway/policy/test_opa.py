"""The OPA engine against real OPA servers: answers, revisions, failing closed.

Failure modes use a real OPA with a policy that misbehaves; only the transport
cases that a healthy OPA never produces (a connection dropped before answering)
use a bare socket server.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gateway.policy.base import PolicyEngineError
from gateway.policy.opa import OpaEngine
from gateway.policy.rego import CompiledPolicy
from gateway.policy.sources import fingerprint, load_sources
from tests.gateway.policy.conftest import TIMEOUT_MS, write_policy
from tests.policies.inputs import base_input
from tests.policies.opa_server import POLICIES, OpaServer, free_port
from tests.waiting import HUNG_S, until

StartOpa = Callable[[Path], OpaServer]


async def started(url: str, timeout_ms: int = TIMEOUT_MS) -> OpaEngine:
    engine = OpaEngine(url, timeout_ms=timeout_ms)
    await engine.start()
    return engine


async def decide_error(engine: OpaEngine, doc: dict | None = None) -> PolicyEngineError:
    with pytest.raises(PolicyEngineError) as info:
        await engine.decide(base_input() if doc is None else doc)
    return info.value


async def test_decision_id_joins_opas_decision_log(opa_server: OpaServer) -> None:
    engine = await started(opa_server.url)
    try:
        answer = await engine.decide(base_input())
    finally:
        await engine.close()
    assert answer.engine_decision_id
    logged = [e for e in opa_server.decision_log() if e["decision_id"] == answer.engine_decision_id]
    assert len(logged) == 1
    entry = logged[0]
    assert entry["path"] == "execgate/decision"
    assert entry["result"] == answer.value
    assert entry["bundles"]["execgate"]["revision"] == answer.revision
    # The mask rule (policies/system/log.rego) keeps the code out of OPA's log.
    assert "code" not in entry["input"]["execution"]
    assert "/input/execution/code" in entry["erased"]


async def test_secret_looking_claims_masked_in_opas_log(opa_server: OpaServer) -> None:
    doc = base_input()
    doc["subject"]["claims"] = {"api_token": "s3cr3t-value", "tier": "free"}
    engine = await started(opa_server.url)
    try:
        answer = await engine.decide(doc)
    finally:
        await engine.close()
    log_text = opa_server.log_path.read_text()
    assert "s3cr3t-value" not in log_text and "print(sum(range(10)))" not in log_text
    entry = next(
        e for e in opa_server.decision_log() if e["decision_id"] == answer.engine_decision_id
    )
    assert entry["input"]["subject"]["claims"] == {"tier": "free"}


async def test_health_names_bundle_revision(opa_server: OpaServer) -> None:
    engine = await started(opa_server.url)
    try:
        healthy, detail = await engine.health()
    finally:
        await engine.close()
    assert healthy, detail
    assert engine.revision == opa_server.revision()
    assert engine.revision[:12] in detail


async def test_unreachable_opa_fails_closed_quickly() -> None:
    # A deadline far beyond the hang bound: a refused connection is retried
    # briefly and answered, never waited on until the deadline (which only a
    # hang bound would then catch).
    engine = await started(f"http://127.0.0.1:{free_port()}", timeout_ms=10 * 60_000)
    try:
        assert (await engine.health())[0] is False
        async with asyncio.timeout(HUNG_S):
            error = await decide_error(engine)
        assert error.kind == "unavailable" and "unreachable" in error.message
    finally:
        await engine.close()


@pytest.mark.parametrize(
    ("rego", "kind", "expected"),
    [
        ("x := 1", "invalid", "undefined"),
        ('decision := "allow"', "invalid", "a string, not an object"),
        ("decision := [true]", "invalid", "an array"),
        ("decision := input.n", "invalid", "a number"),
        (
            "decision := 1 if input.request\ndecision := 2 if input.request",
            "invalid",
            "conflict",
        ),
    ],
    ids=["undefined", "string", "array", "number", "conflict"],
)
async def test_unusable_decision_is_invalid(
    tmp_path: Path, own_opa: StartOpa, rego: str, kind: str, expected: str
) -> None:
    server = own_opa(write_policy(tmp_path / "p", f"package execgate\nimport rego.v1\n{rego}\n"))
    engine = await started(server.url)
    try:
        error = await decide_error(engine, {**base_input(), "n": 3})
    finally:
        await engine.close()
    assert error.kind == kind
    assert expected in error.message


SLOW = (
    "package execgate\nimport rego.v1\n"
    'decision := {"n": count([x | some x in numbers.range(1, object.get(input, "n", 1))])}\n'
)


async def test_timeout_fails_closed_and_is_not_retried(tmp_path: Path, own_opa: StartOpa) -> None:
    server = own_opa(write_policy(tmp_path / "p", SLOW))
    engine = await started(server.url, timeout_ms=50)
    try:
        error = await decide_error(engine, {"n": 3_000_000})
        assert error.kind == "unavailable" and "50 ms" in error.message
        assert (await engine.decide({"n": 3})).value == {"n": 3}  # the pool still works
    finally:
        await engine.close()

    def sent() -> list[str]:
        return [
            line
            for line in server.log_path.read_text().splitlines()
            if '"Received request."' in line and "/v1/data/execgate/decision" in line
        ]

    # Any retry of the slow query reached OPA before the quick one was sent (the
    # client waited for it), so once the quick one is logged all of them are.
    await until(lambda: len(sent()) >= 2, what="OPA logged both queries")
    assert len(sent()) == 2, sent()  # the slow query once, then the quick one


async def test_dropped_connection_is_retried_once_safely() -> None:
    """A connection closed before any answer (OPA restarting) is safe to retry."""
    answer = {
        "decision_id": "d-1",
        "provenance": {"bundles": {"execgate": {"revision": "r1"}}},
        "result": {"allow": True},
    }
    body = json.dumps(answer).encode()
    seen = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal seen
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"POST "):
            writer.close()  # the health check at start: not what is counted here
            return
        seen += 1
        length = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )  # fmt: skip
        await reader.readexactly(length)
        if seen > 1:
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    engine = OpaEngine(f"http://127.0.0.1:{port}", timeout_ms=2000)
    await engine.start()
    try:
        got = await engine.decide(base_input())
    finally:
        await engine.close()
        server.close()
    assert (got.value, got.revision, got.engine_decision_id) == ({"allow": True}, "r1", "d-1")
    assert seen == 2


def files_revision(server: OpaServer) -> str:
    """The hash computed here from what OPA lists, independently of the engine."""
    with urllib.request.urlopen(f"{server.url}/v1/policies", timeout=5) as resp:
        modules = json.loads(resp.read())["result"]
    pairs = sorted([m["id"], m["raw"]] for m in modules)
    canonical = json.dumps(pairs, ensure_ascii=False, separators=(",", ":"))
    return "opa-files:" + hashlib.sha256(canonical.encode()).hexdigest()


async def test_opa_started_from_files_decides_and_names_its_files(files_opa: OpaServer) -> None:
    """`opa run --server policies/` (no bundle service): decisions, honestly labelled."""
    engine = await started(files_opa.url)
    try:
        ok, detail = await engine.health()
        answer = await engine.decide(base_input())
    finally:
        await engine.close()
    assert ok, detail
    assert "no bundle" in detail and "not a bundle revision" in detail
    expected = CompiledPolicy(load_sources(POLICIES)).evaluate(base_input())
    assert answer.value == expected
    assert answer.revision == files_revision(files_opa)
    assert answer.revision != fingerprint(POLICIES)  # not passed off as the bundle's


async def test_files_revision_follows_an_edit(tmp_path: Path, own_opa: StartOpa) -> None:
    policy = write_policy(tmp_path / "p", 'package execgate\ndecision := {"allow": true}\n')
    server = own_opa(policy, files=True)
    engine = await started(server.url)
    try:
        first = await engine.decide(base_input())
        write_policy(policy, 'package execgate\ndecision := {"allow": false}\n')
        for _ in range(600):  # OPA's --watch, then the engine's re-read: a bound for a hang
            answer = await engine.decide(base_input())
            if answer.value == {"allow": False} and answer.revision != first.revision:
                break
            await asyncio.sleep(0.05)
    finally:
        await engine.close()
    assert first.value == {"allow": True} and first.revision.startswith("opa-files:")
    assert answer.value == {"allow": False}
    assert answer.revision == files_revision(server) != first.revision


@pytest.mark.parametrize(
    ("rego", "expected"),
    [
        ('other := {"allow": true}', "undefined"),
        ('decision := "allow"', "a string, not an object"),
        ("decision := 1 if input.request\ndecision := 2 if input.request", "conflict"),
    ],
    ids=["undefined", "string", "conflict"],
)
async def test_files_opa_still_fails_closed(
    tmp_path: Path, own_opa: StartOpa, rego: str, expected: str
) -> None:
    server = own_opa(write_policy(tmp_path / "p", f"package execgate\n{rego}\n"), files=True)
    engine = await started(server.url)
    try:
        error = await decide_error(engine)
    finally:
        await engine.close()
    assert error.kind == "invalid" and expected in error.message


async def test_files_opa_with_no_policy_is_not_ready(tmp_path: Path, own_opa: StartOpa) -> None:
    (tmp_path / "empty").mkdir()
    server = own_opa(tmp_path / "empty", files=True)
    engine = await started(server.url)
    try:
        ok, detail = await engine.health()
        error = await decide_error(engine)
    finally:
        await engine.close()
    assert not ok and "no policy modules" in detail
    assert error.kind == "invalid" and "undefined" in error.message


async def test_bundles_none_of_them_configured_are_refused(opa_server: OpaServer) -> None:
    """OPA has bundles but not policy.opa_bundle: a misconfiguration, not file mode."""
    engine = OpaEngine(opa_server.url, timeout_ms=TIMEOUT_MS, bundle="other")
    await engine.start()
    try:
        ok, detail = await engine.health()
        error = await decide_error(engine)
    finally:
        await engine.close()
    assert not ok and "policy.opa_bundle" in detail
    assert error.kind == "invalid" and "'other'" in error.message and "execgate" in error.message


async def test_unbundled_answer_is_unversioned_while_opa_does_not_list_its_files(
    aiohttp_server: Any,
) -> None:
    """A server that decides without bundles but cannot list its modules: the decision
    still carries a name, `unversioned`, and readiness says why (a stand-in server: a
    real OPA always lists them)."""

    def reply(body: object, status: int = 200) -> Callable[[web.Request], Any]:
        async def handle(_: web.Request) -> web.Response:
            return web.json_response(body, status=status)

        return handle

    app = web.Application()
    app.router.add_get("/health", reply({}))
    app.router.add_get("/v1/data/system/bundles", reply({"result": {}}))
    app.router.add_get("/v1/policies", reply({"code": "x"}, 500))
    answer = {"result": {"allow": True}, "provenance": {"version": "1.22.4"}}
    app.router.add_post("/v1/data/execgate/decision", reply(answer))
    server = await aiohttp_server(app)
    engine = await started(str(server.make_url("")))
    try:
        got = await engine.decide(base_input())
        ok, detail = await engine.health()
    finally:
        await engine.close()
    assert got.value == {"allow": True} and got.revision == "unversioned"
    assert not ok and "/v1/policies 500" in detail


async def test_deep_decision_from_a_real_opa_fails_closed(
    tmp_path: Path, own_opa: StartOpa
) -> None:
    """OPA writes what the policy builds: a decision nested past the bound is refused."""
    deep = "[" * 200 + "1" + "]" * 200
    rego = f'package execgate\nimport rego.v1\ndecision := {{"allow": true, "x": {deep}}}\n'
    server = own_opa(write_policy(tmp_path / "p", rego))
    engine = await started(server.url)
    try:
        error = await decide_error(engine)
    finally:
        await engine.close()
    assert error.kind == "invalid" and "nested deeper" in error.message


async def _answering(body: bytes) -> tuple[asyncio.Server, str]:
    """A bare HTTP server answering every request with `body` (what no real OPA writes)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (int(line.split(b":")[1]) for line in head.split(b"\r\n")
             if line.lower().startswith(b"content-length:")),
            0,
        )  # fmt: skip
        await reader.readexactly(length)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


@pytest.mark.parametrize(
    "body",
    [
        b'{"provenance":{"bundles":{"execgate":{"revision":"r1"}}},'
        b'"result":{"allow":false,"allow":true}}',
        b'{"provenance":{"bundles":{"execgate":{"revision":"r1"}}},'
        b'"result":{"allow":false},"result":{"allow":true}}',
        b'{"provenance":{"bundles":{"execgate":{"revision":"r1"}}},"result":{"allow":true,'
        b'"obligations":{"limits":{"memory_mb":64,"memory_mb":65536}}}}',
        b'{"provenance":{"bundles":{"execgate":{"revision":"r1"}}},"result":{"allow":true,"x":'
        + b"[" * 100_000
        + b"]" * 100_000
        + b"}}",
    ],
    ids=["duplicate allow", "duplicate result", "duplicate obligation", "100k levels"],
)
async def test_ambiguous_or_deep_answer_fails_closed(body: bytes) -> None:
    server, url = await _answering(body)
    engine = OpaEngine(url, timeout_ms=TIMEOUT_MS)
    await engine.start()
    try:
        error = await decide_error(engine)
    finally:
        await engine.close()
        server.close()
    assert error.kind == "invalid", error.message
    assert "duplicate object key" in error.message or "nested deeper" in error.message
