"""LimitState in-process: one gateway, no shared store (the default).

The same rules as the Redis scripts (lua/*.lua), in Python: GCRA for the rate,
per-minute CPU buckets for the rolling hour, a per-UTC-day counter, leases with
expiry for concurrency and global slots.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway.state.base import BUCKET_S, DAY_S, HOUR_S, Quota, Refusal, Usage

_BUCKETS = int(HOUR_S / BUCKET_S)
# How long a refused slot request counts as waiting without asking again.
WAIT_TTL_S = 2.0


@dataclass
class _Tenant:
    tat: float = 0.0
    day: int = -1
    day_count: int = 0
    cpu: dict[int, float] = field(default_factory=dict)  # minute -> cpu_s
    leases: dict[str, float] = field(default_factory=dict)  # lease -> expires at


def gcra_remaining(tat: float, now: float, quota: Quota) -> int:
    interval = 1.0 / quota.rate_per_s
    return max(math.floor((now - (max(tat, now) - quota.burst * interval)) / interval), 0)


class MemoryState:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._tenants: dict[str, _Tenant] = {}
        self._slots: dict[tuple[str, str], float] = {}  # (tenant, lease) -> expires at
        self._waiting: dict[tuple[str, str], float] = {}
        self._spent: dict[str, float] = {}
        self._claims: dict[str, tuple[str, float]] = {}  # key -> (value, expires at)

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def health(self) -> tuple[bool, str]:
        return True, ""

    def _tenant(self, tenant: str) -> _Tenant:
        state = self._tenants.get(tenant)
        if state is None:
            state = self._tenants[tenant] = _Tenant()
        return state

    @staticmethod
    def _cpu(state: _Tenant, now: float) -> tuple[float, int | None]:
        minute = int(now // BUCKET_S)
        for old in [m for m in state.cpu if m <= minute - _BUCKETS]:
            del state.cpu[old]
        return sum(state.cpu.values()), min(state.cpu, default=None)

    @staticmethod
    def _live(leases: dict[str, float], now: float) -> int:
        for lease in [k for k, exp in leases.items() if exp <= now]:
            del leases[lease]
        return len(leases)

    @staticmethod
    def _rate(state: _Tenant, now: float, quota: Quota) -> Refusal | float:
        """The refusal, or the new theoretical arrival time once this request is spent."""
        interval = 1.0 / quota.rate_per_s
        tat = max(state.tat, now)
        allow_at = tat - (quota.burst - 1) * interval
        if now < allow_at:
            return Refusal("rate", allow_at - now)
        return tat + interval

    async def spend_rate(self, tenant: str, quota: Quota) -> Refusal | None:
        state = self._tenant(tenant)
        tat = self._rate(state, self._clock(), quota)
        if isinstance(tat, Refusal):
            return tat
        state.tat = tat
        return None

    async def admit(self, tenant: str, quota: Quota, lease: str, ttl_s: float) -> Refusal | None:
        now = self._clock()
        state = self._tenant(tenant)
        tat = self._rate(state, now, quota)
        if isinstance(tat, Refusal):
            return tat
        used, oldest = self._cpu(state, now)
        if used >= quota.cpu_s_per_hour:
            assert oldest is not None
            return Refusal("cpu", (oldest + _BUCKETS) * BUCKET_S - now)
        day = int(now // DAY_S)
        count = state.day_count if state.day == day else 0
        if count >= quota.executions_per_day:
            return Refusal("day", (day + 1) * DAY_S - now)
        if self._live(state.leases, now) >= quota.max_concurrent:
            return Refusal("concurrency", 1.0)
        state.tat = tat
        state.day, state.day_count = day, count + 1
        state.leases[lease] = now + ttl_s
        return None

    async def usage(self, tenant: str, quota: Quota) -> Usage:
        now = self._clock()
        state = self._tenant(tenant)
        day = int(now // DAY_S)
        return Usage(
            concurrent=self._live(state.leases, now),
            cpu_s_last_hour=round(self._cpu(state, now)[0], 3),
            executions_today=state.day_count if state.day == day else 0,
            rate_remaining=gcra_remaining(state.tat, now, quota),
        )

    async def charge_cpu(self, tenant: str, cpu_s: float) -> None:
        if cpu_s > 0:
            state = self._tenant(tenant)
            minute = int(self._clock() // BUCKET_S)
            state.cpu[minute] = state.cpu.get(minute, 0.0) + cpu_s

    async def take_slot(self, tenant: str, lease: str, cap: int, ttl_s: float) -> bool:
        now = self._clock()
        self._live_slots(now)
        held: dict[str, int] = {}
        for owner, _ in self._slots:
            held[owner] = held.get(owner, 0) + 1
        mine = held.get(tenant, 0)
        ok = len(self._slots) < cap and not any(
            owner != tenant and held.get(owner, 0) < mine for owner, _ in self._waiting
        )
        if ok:
            self._slots[(tenant, lease)] = now + ttl_s
            self._waiting.pop((tenant, lease), None)
        else:
            self._waiting[(tenant, lease)] = now + WAIT_TTL_S
        return ok

    def _live_slots(self, now: float) -> None:
        for table in (self._slots, self._waiting):
            for key in [k for k, exp in table.items() if exp <= now]:
                del table[key]

    async def stop_waiting(self, tenant: str, lease: str) -> None:
        self._waiting.pop((tenant, lease), None)

    async def release(self, tenant: str, lease: str) -> None:
        self._tenant(tenant).leases.pop(lease, None)
        self._slots.pop((tenant, lease), None)
        self._waiting.pop((tenant, lease), None)

    async def renew(self, leases: list[tuple[str, str]], ttl_s: float) -> None:
        until = self._clock() + ttl_s
        for tenant, lease in leases:
            state = self._tenant(tenant)
            if lease in state.leases:
                state.leases[lease] = until
            if (tenant, lease) in self._slots:
                self._slots[(tenant, lease)] = until

    async def spend_once(self, key: str, ttl_s: float) -> bool:
        now = self._clock()
        for old in [k for k, exp in self._spent.items() if exp <= now]:
            del self._spent[old]
        if key in self._spent:
            return False
        self._spent[key] = now + ttl_s
        return True

    async def claim_once(self, key: str, value: str, ttl_s: float) -> str | None:
        now = self._clock()
        for old in [k for k, (_, exp) in self._claims.items() if exp <= now]:
            del self._claims[old]
        held = self._claims.get(key)
        if held is not None:
            return held[0]
        self._claims[key] = (value, now + ttl_s)
        return None
