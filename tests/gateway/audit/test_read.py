"""Reading the audit log: query filters and tail (plain and following)."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest

from gateway.audit.log import AuditLog
from gateway.audit.read import normalise_since, query, tail


async def write_log(path: Path, count: int = 12) -> list[dict]:
    audit = AuditLog(path)
    await audit.start()
    records = []
    for i in range(count):
        records.append(
            await audit.append(
                ("execution.finished", "policy.decided", "auth.failed")[i % 3],
                tenant=("acme", "globex")[i % 2],
                execution_id=f"exe_{i // 3}",
                n=i,
            )
        )
    await audit.close()
    return records


async def test_query_filters(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    records = await write_log(path)

    async def ns(**kwargs: object) -> list[int]:
        return [r["n"] for r in await query(path, **kwargs)]  # type: ignore[arg-type]

    assert await ns() == list(range(12))
    assert await ns(tenant="acme") == [0, 2, 4, 6, 8, 10]
    assert await ns(type="auth.failed") == [2, 5, 8, 11]
    assert await ns(tenant="globex", type="auth.failed") == [5, 11]
    assert await ns(execution_id="exe_2") == [6, 7, 8]
    assert await ns(since=records[9]["ts"]) == [9, 10, 11]
    assert await ns(limit=3) == [0, 1, 2]
    assert await ns(limit=3, newest=True) == [9, 10, 11]
    assert await ns(after_seq=10) == [10, 11]
    assert await ns(tenant="nobody") == []


async def test_query_missing_file_and_bad_since(tmp_path: Path) -> None:
    assert await query(tmp_path / "none.jsonl") == []
    with pytest.raises(ValueError, match="since"):
        await query(tmp_path / "none.jsonl", since="yesterday")


def test_since_accepts_rfc3339_forms() -> None:
    assert normalise_since("2026-11-29T10:00:00Z") == "2026-11-29T10:00:00.000000Z"
    assert normalise_since("2026-11-29T12:00:00+02:00") == "2026-11-29T10:00:00.000000Z"
    assert normalise_since("2026-11-29T10:00:00.5") == "2026-11-29T10:00:00.500000Z"
    assert normalise_since(None) is None


async def test_readers_skip_a_line_being_written(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    await write_log(path, 3)
    with path.open("ab") as f:
        f.write(b'{"seq":4,"te')
    assert [r["seq"] for r in await query(path)] == [1, 2, 3]
    assert [r["seq"] for r in tail(path)] == [1, 2, 3]


async def test_tail_filters_and_last(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    await write_log(path)
    assert [r["n"] for r in tail(path, tenant="acme", last=2)] == [8, 10]
    assert [r["n"] for r in tail(path, type="policy.decided")] == [1, 4, 7, 10]
    assert [r["n"] for r in tail(path, last=0)] == []


async def test_tail_follow_sees_new_records_and_replacement(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    await write_log(path, 2)
    stop = threading.Event()
    seen: list[int] = []
    arrived = threading.Condition()

    def follow() -> None:
        for record in tail(path, follow=True, poll_interval_s=0.01, stop=stop.is_set):
            with arrived:
                seen.append(record["n"])
                arrived.notify_all()

    def wait_for(count: int) -> bool:
        with arrived:
            return arrived.wait_for(lambda: len(seen) >= count, timeout=30)

    reader = asyncio.create_task(asyncio.to_thread(follow))
    try:
        assert await asyncio.to_thread(wait_for, 2)
        audit = AuditLog(path)
        await audit.start()
        await audit.append("late", n=100)
        await audit.append("late", n=101)
        await audit.close()
        assert await asyncio.to_thread(wait_for, 4)

        # Rotated: a new file under the same name is followed from its start.
        os.rename(path, tmp_path / "audit.jsonl.1")
        audit = AuditLog(path)
        await audit.start()
        await audit.append("rotated", n=200)
        await audit.close()
        assert await asyncio.to_thread(wait_for, 5)
    finally:
        stop.set()
        await reader
    assert seen == [0, 1, 100, 101, 200]


async def test_behaviour_and_review_filters(tmp_path: Path) -> None:
    log = AuditLog(tmp_path / "audit.jsonl")
    await log.start()
    high = {"rule": "credential_path", "severity": "high", "detail": "open /etc/shadow"}
    low = {"rule": "shell_spawned", "severity": "low", "detail": "sh"}
    await log.append("execution.review", execution_id="exe_a", flags=[high])
    await log.append("execution.review", execution_id="exe_b", flags=[low])
    await log.append("execution.review", execution_id="exe_c", flags=[])
    await log.append("execution.behaviour", execution_id="exe_a", files=[{"path": "/x"}],
                     programs=[], signals=[], syscalls_refused={})  # fmt: skip
    await log.append("execution.behaviour", execution_id="exe_b", files=[], programs=[],
                     signals=[], syscalls_refused={"mount": 1})  # fmt: skip
    await log.close()
    path = tmp_path / "audit.jsonl"

    async def ids(**filters: object) -> list[str]:
        return [r["execution_id"] for r in await query(path, **filters)]  # type: ignore[arg-type]

    assert await ids(flagged=True) == ["exe_a", "exe_b"]
    assert await ids(severity="high") == ["exe_a"]
    assert await ids(flagged=True, severity="low") == ["exe_b"]
    assert await ids(attempt="files") == ["exe_a"]
    assert await ids(attempt="syscalls_refused") == ["exe_b"]
    assert await ids(attempt="signals") == []
