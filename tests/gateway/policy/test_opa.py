"""The OPA engine against real OPA servers: answers, revisions, failing closed.

Failure modes use a real OPA with a policy that misbehaves; only the transport
cases that a healthy OPA never produces (a connection dropped before answering)
use a bare socket server.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gateway.policy.base import PolicyEngineError
from gateway.policy.opa import OpaEngine
from tests.gateway.policy.conftest import TIMEOUT_MS, write_policy
from tests.policies.inputs import base_input
from tests.policies.opa_server import OpaServer, find_opa, free_port

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
    engine = await started(f"http://127.0.0.1:{free_port()}", timeout_ms=2000)
    try:
        assert (await engine.health())[0] is False
        t0 = time.monotonic()
        error = await decide_error(engine)
        assert error.kind == "unavailable" and "unreachable" in error.message
        assert time.monotonic() - t0 < 1.5  # refused: retried briefly, not for the deadline
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
    await asyncio.sleep(0.5)
    sent = [
        line
        for line in server.log_path.read_text().splitlines()
        if '"Received request."' in line and "/v1/data/execgate/decision" in line
    ]
    assert len(sent) == 2, sent  # the slow query once, then the quick one


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


async def test_answer_without_bundle_revision_is_refused(tmp_path: Path) -> None:
    """An OPA that decides from plain files (no bundle) cannot say which policy decided."""
    port = free_port()
    write_policy(tmp_path / "p", 'package execgate\nimport rego.v1\ndecision := {"allow": true}\n')
    proc = await asyncio.create_subprocess_exec(
        find_opa(), "run", "--server", "--addr", f"127.0.0.1:{port}", "--skip-version-check",
        str(tmp_path / "p"),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    engine = OpaEngine(f"http://127.0.0.1:{port}", timeout_ms=2000)
    try:
        await engine.start()
        for _ in range(200):  # until OPA listens
            error = await decide_error(engine)
            if error.kind == "invalid":
                break
            await asyncio.sleep(0.05)
        assert error.kind == "invalid" and "bundle" in error.message
        assert (await engine.health())[0] is False
    finally:
        await engine.close()
        proc.kill()
        await proc.wait()


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
