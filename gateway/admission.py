"""Per-tenant admission: request rate (GCRA), concurrency slots and CPU-seconds per hour.

In-process state for one gateway; a shared store for replicas comes with its issue.
Every refusal carries Retry-After and the IETF RateLimit headers.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from gateway import errors
from gateway.errors import GatewayError
from gateway.settings import TenantSettings

HOUR_S = 3600.0


@dataclass
class _TenantState:
    tat: float = 0.0  # GCRA theoretical arrival time
    concurrent: int = 0
    cpu: deque[tuple[float, float]] = field(default_factory=deque)  # (when, cpu_s)
    cpu_total: float = 0.0


class Slot:
    """One admitted execution; `release` is idempotent."""

    def __init__(self, admission: Admission, tenant: str) -> None:
        self._admission, self._tenant, self._held = admission, tenant, True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._admission._release(self._tenant)


class Admission:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._tenants: dict[str, _TenantState] = {}

    def _state(self, tenant: str) -> _TenantState:
        state = self._tenants.get(tenant)
        if state is None:
            state = self._tenants[tenant] = _TenantState()
        return state

    def _cpu_last_hour(self, state: _TenantState, now: float) -> float:
        while state.cpu and state.cpu[0][0] <= now - HOUR_S:
            state.cpu_total -= state.cpu.popleft()[1]
        return max(state.cpu_total, 0.0)

    def usage(self, tenant: str) -> dict[str, float | int]:
        state = self._state(tenant)
        return {
            "concurrent": state.concurrent,
            "cpu_s_last_hour": round(self._cpu_last_hour(state, self._clock()), 3),
        }

    def admit(self, tenant: str, limits: TenantSettings) -> Slot:
        now = self._clock()
        state = self._state(tenant)
        interval = 1.0 / limits.rate_per_s
        tat = max(state.tat, now)
        allow_at = tat - (limits.burst - 1) * interval
        if now < allow_at:
            retry = allow_at - now
            raise self._refuse(
                errors.RATE_LIMITED,
                "request rate over the tenant's limit",
                retry,
                limits,
                remaining=0,
            )
        if self._cpu_last_hour(state, now) >= limits.cpu_s_per_hour:
            oldest = state.cpu[0][0] if state.cpu else now
            raise self._refuse(
                errors.QUOTA_EXCEEDED,
                "CPU-seconds per hour used up",
                max(oldest + HOUR_S - now, 1.0),
                limits,
                remaining=0,
            )
        if state.concurrent >= limits.max_concurrent:
            raise self._refuse(
                errors.RATE_LIMITED, "too many concurrent executions", 1.0, limits, remaining=0
            )
        state.tat = tat + interval
        state.concurrent += 1
        return Slot(self, tenant)

    def charge_cpu(self, tenant: str, cpu_s: float) -> None:
        if cpu_s > 0:
            state = self._state(tenant)
            state.cpu.append((self._clock(), cpu_s))
            state.cpu_total += cpu_s

    def _release(self, tenant: str) -> None:
        state = self._state(tenant)
        state.concurrent = max(state.concurrent - 1, 0)

    @staticmethod
    def _refuse(
        kind: errors.ErrorKind, message: str, retry_s: float, limits: TenantSettings, remaining: int
    ) -> GatewayError:
        retry = max(math.ceil(retry_s), 1)
        window = max(math.ceil(limits.burst / limits.rate_per_s), 1)
        headers = {
            "Retry-After": str(retry),
            "RateLimit-Policy": f'"tenant";q={limits.burst};w={window}',
            "RateLimit": f'"tenant";r={remaining};t={retry}',
        }
        return GatewayError(kind, message, headers=headers, retry_after_s=retry)
