"""MCP sessions: bound to their principal, idle expiry, bounded in number."""

from __future__ import annotations

from gateway.auth.tokens import Principal
from gateway.mcp.sessions import McpSessions

ALICE = Principal("alice", "acme", frozenset(), {})
BOB = Principal("bob", "acme", frozenset(), {})
ALICE_ELSEWHERE = Principal("alice", "initech", frozenset(), {})


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_bound_to_the_principal_that_opened_it() -> None:
    sessions = McpSessions(10, 60, Clock())
    s = sessions.open(ALICE, "2025-11-25")
    assert len(s.id) >= 32
    assert sessions.get(s.id, ALICE) is s
    assert sessions.get(s.id, BOB) is None
    assert sessions.get(s.id, ALICE_ELSEWHERE) is None
    sessions.end(s.id)
    assert sessions.get(s.id, ALICE) is None


def test_idle_sessions_expire_and_use_keeps_them() -> None:
    clock = Clock()
    sessions = McpSessions(10, 60, clock)
    s = sessions.open(ALICE, "2025-11-25")
    clock.now = 50
    assert sessions.get(s.id, ALICE) is s
    clock.now = 100
    assert sessions.get(s.id, ALICE) is s
    clock.now = 161
    assert sessions.get(s.id, ALICE) is None


def test_a_flood_of_sessions_evicts_the_least_recently_used() -> None:
    clock = Clock()
    sessions = McpSessions(3, 600, clock)
    ids = []
    for i in range(3):
        clock.now = i
        ids.append(sessions.open(ALICE, "2025-11-25").id)
    clock.now = 10
    sessions.get(ids[0], ALICE)  # used: survives
    sessions.open(ALICE, "2025-11-25")
    assert len(sessions) == 3
    assert sessions.get(ids[0], ALICE) is not None
    assert sessions.get(ids[1], ALICE) is None
