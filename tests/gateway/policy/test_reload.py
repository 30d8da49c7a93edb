"""Hot reload: an edited policy decides without a restart, a broken one never does.

Embedded: the reloader recompiles on change and audits it. OPA: the bundle
server republishes and OPA activates the new bundle on its next poll.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from gateway.audit.log import AuditLog
from gateway.policy.base import PolicyEngine
from gateway.policy.opa import OpaEngine
from gateway.policy.reload import PolicyReloader
from gateway.policy.sources import fingerprint
from tests.gateway.policy.conftest import TIMEOUT_MS, embedded_engine, write_policy
from tests.policies.opa_server import OpaServer

StartOpa = Callable[[Path], OpaServer]


def version(n: int) -> str:
    return f'package execgate\nimport rego.v1\ndecision := {{"allow": true, "v": {n}}}\n'


BROKEN = "package execgate\ndecision := {\n"


@pytest.fixture
async def audit(tmp_path: Path) -> AsyncIterator[AuditLog]:
    log = AuditLog(tmp_path / "audit.jsonl")
    await log.start()
    yield log
    await log.close()


def records(audit: AuditLog, type: str) -> list[dict[str, Any]]:
    lines = Path(audit.path).read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["type"] == type]


@pytest.fixture(params=["embedded", "rego-cpp"])
async def embedded(
    tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[PolicyEngine, Path]]:
    directory = write_policy(tmp_path / "policy", version(1))
    engine = embedded_engine(request.param, directory)
    await engine.start()
    yield engine, directory
    await engine.close()


async def test_edit_is_compiled_and_audited(
    embedded: tuple[PolicyEngine, Path], audit: AuditLog
) -> None:
    engine, directory = embedded
    reloader = PolicyReloader(engine, directory, audit, interval_s=60)
    first = engine.revision
    assert await reloader.check() is False  # nothing changed
    write_policy(directory, version(2))
    assert await reloader.check() is True
    answer = await engine.decide({})
    assert answer.value == {"allow": True, "v": 2}
    assert answer.revision == engine.revision == fingerprint(directory) != first
    [record] = records(audit, "policy.reloaded")
    assert (record["old_revision"], record["new_revision"]) == (first, engine.revision)


async def test_broken_edit_keeps_the_old_policy_and_says_so_once(
    embedded: tuple[PolicyEngine, Path], audit: AuditLog, caplog: pytest.LogCaptureFixture
) -> None:
    engine, directory = embedded
    reloader = PolicyReloader(engine, directory, audit, interval_s=60)
    first = engine.revision
    write_policy(directory, BROKEN)
    assert await reloader.check() is False
    assert await reloader.check() is False  # same broken content: not again
    answer = await engine.decide({})
    assert (answer.value, answer.revision) == ({"allow": True, "v": 1}, first)
    [failed] = records(audit, "policy.reload_failed")
    assert failed["revision"] == first
    assert failed["refused_revision"] == fingerprint(directory)
    # Each compiler in its words: rego-cpp "policy.rego:2: ... unclosed", OPA
    # "policy.rego:3: rego_parse_error: unexpected eof token".
    assert f"{directory / 'policy.rego'}:" in failed["error"]
    assert "unclosed" in failed["error"] or "rego_parse_error" in failed["error"]
    assert "POLICY RELOAD FAILED" in caplog.text
    write_policy(directory, version(3))  # fixed: taken at once
    assert await reloader.check() is True
    assert (await engine.decide({})).value == {"allow": True, "v": 3}


async def test_vanished_directory_keeps_the_old_policy(
    embedded: tuple[PolicyEngine, Path], audit: AuditLog
) -> None:
    engine, directory = embedded
    reloader = PolicyReloader(engine, directory, audit, interval_s=60)
    shutil.rmtree(directory)
    assert await reloader.check() is False
    assert await reloader.check() is False
    assert (await engine.decide({})).value == {"allow": True, "v": 1}
    [failed] = records(audit, "policy.reload_failed")
    assert failed["refused_revision"] is None and "not found" in failed["error"]


async def test_reloader_polls_in_the_background(
    embedded: tuple[PolicyEngine, Path], audit: AuditLog
) -> None:
    engine, directory = embedded
    reloader = PolicyReloader(engine, directory, audit, interval_s=0.05)
    reloader.start()
    try:
        write_policy(directory, version(4))
        await until(lambda: engine_value(engine), {"allow": True, "v": 4})
    finally:
        await reloader.close()


async def engine_value(engine: PolicyEngine) -> Any:
    return (await engine.decide({})).value


async def until(probe: Callable[[], Any], expected: Any, timeout_s: float = 20.0) -> None:
    # Polling on purpose: the change happens in another process or task.
    async with asyncio.timeout(timeout_s):
        while (got := await probe()) != expected:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
    assert got == expected


async def test_opa_takes_an_edit_without_restart(tmp_path: Path, own_opa: StartOpa) -> None:
    directory = write_policy(tmp_path / "policy", version(1))
    server = own_opa(directory)
    engine = OpaEngine(server.url, timeout_ms=TIMEOUT_MS)
    await engine.start()
    try:
        first = await engine.decide({})
        assert first.value == {"allow": True, "v": 1}
        assert first.revision == fingerprint(directory)
        write_policy(directory, version(2))
        await until(lambda: engine_value(engine), {"allow": True, "v": 2})
        second = await engine.decide({})
        assert second.revision == fingerprint(directory) != first.revision
        # A policy that does not compile is refused by OPA; the last good one stays.
        write_policy(directory, BROKEN)
        await asyncio.sleep(3)  # several polls (bundle server 0.2 s, OPA 1 s)
        third = await engine.decide({})
        assert (third.value, third.revision) == (second.value, second.revision)
        assert "rego_parse_error" in server.log_path.read_text()
    finally:
        await engine.close()
