"""The approval store: persistence, decisions that race, expiry, single-use token ids."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from gateway.approvals.records import Approval, ApprovalError, ApprovalStore


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def approval(i: str = "apr_1", ttl: float = 60) -> Approval:
    return Approval(
        id=i,
        tenant="acme",
        requester="alice",
        execution_id="exe_1",
        principal={"sub": "alice", "tenant": "acme", "scopes": [], "claims": {}},
        request={"language": "python", "code": "import ctypes", "files": [], "limits": {}},
        language="python",
        code_sha256="0" * 64,
        features=["native_code"],
        reasons=["why"],
        created_at=1_000_000.0,
        expires_at=1_000_000.0 + ttl,
    )


def assert_one_winner(results: list[object]) -> Approval:
    """Of (approve by bob, deny by carol) racing: exactly one won, the other lost
    with a conflict, and the stored decision is the winner's own, not the loser's."""
    expected = {0: ("approved", "bob"), 1: ("denied", "carol")}
    won = [i for i, r in enumerate(results) if isinstance(r, tuple)]
    assert len(won) == 1, results
    (index,) = won
    loser = results[1 - index]
    assert isinstance(loser, ApprovalError) and loser.kind == "conflict", loser
    decided, changed = results[index]  # type: ignore[misc]
    assert changed is True
    assert (decided.status, decided.approver) == expected[index]
    return decided


async def test_decisions_are_persistent_idempotent_and_exclusive(tmp_path: Path) -> None:
    store = ApprovalStore(tmp_path / "state.db", clock=Clock())
    await store.start()
    await store.create(approval())
    results = await asyncio.gather(
        store.decide("apr_1", "approve", "bob", "ok"),
        store.decide("apr_1", "deny", "carol", "no"),
        return_exceptions=True,
    )
    winner = assert_one_winner(results)
    word = {"approved": "approve", "denied": "deny"}[winner.status]
    again, changed = await store.decide("apr_1", word, "x", "")
    assert changed is False and again.status == winner.status
    await store.close()

    reopened = ApprovalStore(tmp_path / "state.db", clock=Clock())
    await reopened.start()
    got = await reopened.get("apr_1")
    # What persisted is the winner's decision, by the winner.
    assert got is not None and got.decided_at
    assert (got.status, got.approver) == (winner.status, winner.approver)
    with pytest.raises(ApprovalError) as exc:
        await reopened.decide("apr_missing", "approve", "bob", "")
    assert exc.value.kind == "not_found"
    await reopened.close()


async def test_expiry_also_after_a_restart(tmp_path: Path) -> None:
    clock = Clock()
    store = ApprovalStore(tmp_path / "state.db", clock=clock)
    await store.start()
    await store.create(approval(ttl=5))
    await store.close()
    clock.now += 10
    store = ApprovalStore(tmp_path / "state.db", clock=clock)
    await store.start()
    expired = await store.expire_due()
    assert [a.id for a in expired] == ["apr_1"]
    with pytest.raises(ApprovalError) as exc:
        await store.decide("apr_1", "approve", "bob", "")
    assert exc.value.kind == "expired"
    await store.close()


async def test_a_token_id_is_spent_once(tmp_path: Path) -> None:
    store = ApprovalStore(tmp_path / "state.db", clock=Clock())
    await store.start()
    spent = await asyncio.gather(*(store.spend_token("jti-1", 2_000_000.0) for _ in range(10)))
    assert spent.count(True) == 1
    await store.close()
