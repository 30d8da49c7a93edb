"""What admission, approvals and approval tokens need of shared state.

Two implementations: `memory` (one gateway, in-process; approvals stay in SQLite)
and `redis` (several replicas, every check one atomic Lua script). Both keep the
same semantics, so one set of admission tests runs against each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

HOUR_S = 3600.0
DAY_S = 86400.0
BUCKET_S = 60.0  # CPU-seconds are counted per minute; the rolling hour is 60 buckets

Limit = Literal["rate", "concurrency", "cpu", "day"]


class StateUnavailable(Exception):
    """The shared state cannot be read or written: nothing is admitted (fail closed)."""


@dataclass(frozen=True, slots=True)
class Quota:
    """One tenant's limits, as the state checks them."""

    rate_per_s: float
    burst: int
    max_concurrent: int
    cpu_s_per_hour: float
    executions_per_day: int


@dataclass(frozen=True, slots=True)
class Refusal:
    limit: Limit
    retry_s: float


@dataclass(frozen=True, slots=True)
class Usage:
    concurrent: int
    cpu_s_last_hour: float
    executions_today: int
    # What the rate limit would still let through right now.
    rate_remaining: int = 0


class LimitState(Protocol):
    """Per-tenant counters, leases and single-use marks. Every method may raise
    StateUnavailable; none of them blocks the event loop."""

    async def start(self) -> None: ...
    async def close(self) -> None: ...
    async def health(self) -> tuple[bool, str]: ...

    async def admit(self, tenant: str, quota: Quota, lease: str, ttl_s: float) -> Refusal | None:
        """Check rate, CPU hour, day count and concurrency at once; on success
        spend one request of each and hold `lease` (until released or `ttl_s`)."""
        ...

    async def spend_rate(self, tenant: str, quota: Quota) -> Refusal | None:
        """The rate check alone (the same GCRA as `admit`): a request that runs no
        code (a proxy pass-through) spends the tenant's rate, nothing else."""
        ...

    async def usage(self, tenant: str, quota: Quota) -> Usage: ...
    async def charge_cpu(self, tenant: str, cpu_s: float) -> None: ...

    async def take_slot(self, tenant: str, lease: str, cap: int, ttl_s: float) -> bool:
        """One of `cap` global slots, unless a waiting tenant holds fewer than this
        one (max-min fairness); refused callers are recorded as waiting."""
        ...

    async def stop_waiting(self, tenant: str, lease: str) -> None: ...
    async def release(self, tenant: str, lease: str) -> None: ...
    async def renew(self, leases: list[tuple[str, str]], ttl_s: float) -> None: ...

    async def spend_once(self, key: str, ttl_s: float) -> bool:
        """True the first time `key` is spent (until `ttl_s` passes), across replicas."""
        ...

    async def claim_once(self, key: str, value: str, ttl_s: float) -> str | None:
        """None the first time `key` is claimed (it then holds `value` until `ttl_s`
        passes, across replicas); afterwards the value its first claim stored."""
        ...
