"""Shared state behind one interface: in-process (default) or Redis (replicas).

`state.backend = "sqlite"`: limits in memory (MemoryState), approvals and spent
token ids in SQLite at `state.path`. `state.backend = "redis"`: both in Redis at
`state.redis_url`, shared by every replica pointed at it.
"""

from __future__ import annotations

from pathlib import Path

from gateway.approvals.records import ApprovalRecords, ApprovalStore
from gateway.settings.model import StateSettings
from gateway.state.base import LimitState, StateUnavailable
from gateway.state.memory import MemoryState
from gateway.state.redis_approvals import RedisApprovalStore
from gateway.state.redis_state import RedisState

__all__ = ["LimitState", "StateUnavailable", "make_state"]


def make_state(settings: StateSettings) -> tuple[LimitState, ApprovalRecords]:
    """The limit state and the approval records for this configuration (not started)."""
    if settings.backend == "redis":
        state = RedisState(settings.redis_url, timeout_s=settings.redis_timeout_s)
        return state, RedisApprovalStore(state)
    return MemoryState(), ApprovalStore(Path(settings.path))
