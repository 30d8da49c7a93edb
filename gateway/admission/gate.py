"""Per-tenant admission: rate (GCRA), CPU-seconds per rolling hour, executions per
day, concurrent executions, and a global concurrency cap shared fairly.

The counters live in a LimitState (gateway/state/): in-process for one gateway, or
Redis for replicas. Each tenant check-and-spend is one atomic step; a request then
waits (at most `queue_timeout_s`) for one of the global slots, which go to the
waiting tenant holding the fewest (max-min fairness). Every refusal carries
Retry-After and the IETF RateLimit / RateLimit-Policy headers; a state that cannot
be reached admits nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import secrets
import time

from gateway import errors
from gateway.errors import GatewayError
from gateway.settings.model import AdmissionSettings, Settings, TenantSettings
from gateway.state.base import DAY_S, HOUR_S, LimitState, Quota, Refusal, StateUnavailable
from gateway.state.memory import MemoryState

log = logging.getLogger(__name__)

# A waiter asks the shared state again after POLL_S, backing off to POLL_MAX_S
# (another replica's release wakes nobody here); releases on this gateway wake
# waiters at once. Fairness does not depend on it: a waiter stays registered as
# waiting between polls (gateway/state/memory.py WAIT_TTL_S).
POLL_S = 0.01
POLL_MAX_S = 0.2

_MESSAGES = {
    "rate": (errors.RATE_LIMITED, "request rate over the tenant's limit"),
    "concurrency": (errors.RATE_LIMITED, "too many concurrent executions"),
    "cpu": (errors.QUOTA_EXCEEDED, "CPU-seconds per hour used up"),
    "day": (errors.QUOTA_EXCEEDED, "executions per day used up"),
}


def quota(limits: TenantSettings) -> Quota:
    return Quota(
        rate_per_s=limits.rate_per_s,
        burst=limits.burst,
        max_concurrent=limits.max_concurrent,
        cpu_s_per_hour=limits.cpu_s_per_hour,
        executions_per_day=limits.executions_per_day,
    )


def policy_header(limits: TenantSettings) -> str:
    """RateLimit-Policy (draft-ietf-httpapi-ratelimit-headers): every limit that applies."""
    window = max(math.ceil(limits.burst / limits.rate_per_s), 1)
    return ", ".join(
        [
            f'"rate";q={limits.burst};w={window}',
            f'"concurrency";q={limits.max_concurrent};qu="concurrent-requests"',
            f'"cpu";q={math.floor(limits.cpu_s_per_hour)};w={int(HOUR_S)};qu="cpu-seconds"',
            f'"day";q={limits.executions_per_day};w={int(DAY_S)}',
        ]
    )


def state_error(exc: StateUnavailable) -> GatewayError:
    return GatewayError(errors.STATE_UNAVAILABLE, f"limit state unavailable: {exc}")


class Slot:
    """One admitted execution; `release` is idempotent and never raises."""

    def __init__(self, admission: Admission, tenant: str, lease: str) -> None:
        self._admission, self.tenant, self.lease = admission, tenant, lease
        self._held = True

    async def release(self) -> None:
        if self._held:
            self._held = False
            await self._admission._release(self.tenant, self.lease)


class Admission:
    def __init__(
        self,
        state: LimitState | None = None,
        settings: AdmissionSettings | None = None,
    ) -> None:
        self.state: LimitState = state if state is not None else MemoryState()
        self.settings = settings or AdmissionSettings()
        self._held: dict[str, str] = {}  # lease -> tenant, renewed while it runs
        self._freed: asyncio.Event | None = None
        self._renewer: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self.state.start()
        self._renewer = asyncio.create_task(self._renew_forever())

    async def close(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renewer
        await self.state.close()

    async def _renew_forever(self) -> None:
        ttl = self.settings.lease_ttl_s
        while True:
            await asyncio.sleep(ttl / 3)
            try:
                await self.state.renew(sorted((t, lease) for lease, t in self._held.items()), ttl)
            except StateUnavailable as exc:
                log.warning("could not renew %d leases: %s", len(self._held), exc)
            except Exception:
                # Keep renewing: a dead renewer would let running executions' leases lapse.
                log.exception("lease renewal failed")

    async def usage(self, tenant: str, limits: TenantSettings) -> dict[str, float | int]:
        try:
            usage = await self.state.usage(tenant, quota(limits))
        except StateUnavailable as exc:
            raise state_error(exc) from None
        return {
            "concurrent": usage.concurrent,
            "cpu_s_last_hour": usage.cpu_s_last_hour,
            "executions_today": usage.executions_today,
        }

    async def spend_rate(self, tenant: str, limits: TenantSettings) -> None:
        """Admit a request that runs no code (a proxy pass-through) against the
        tenant's request rate, shared with its executions; raises the same 429."""
        try:
            refusal = await self.state.spend_rate(tenant, quota(limits))
        except StateUnavailable as exc:
            raise state_error(exc) from None
        if refusal is not None:
            raise self._refuse(refusal, limits)

    async def admit(self, tenant: str, limits: TenantSettings) -> Slot:
        lease = secrets.token_hex(8)
        ttl = self.settings.lease_ttl_s
        try:
            refusal = await self.state.admit(tenant, quota(limits), lease, ttl)
        except StateUnavailable as exc:
            raise state_error(exc) from None
        if refusal is not None:
            raise self._refuse(refusal, limits)
        self._held[lease] = tenant
        slot = Slot(self, tenant, lease)
        try:
            if self.settings.max_concurrent_executions > 0:
                await self._wait_for_slot(tenant, lease)
        except BaseException:
            await slot.release()
            raise
        return slot

    async def _wait_for_slot(self, tenant: str, lease: str) -> None:
        cap, ttl = self.settings.max_concurrent_executions, self.settings.lease_ttl_s
        deadline = time.monotonic() + self.settings.queue_timeout_s
        poll = POLL_S
        try:
            while True:
                freed = self._freed_event()
                if await self.state.take_slot(tenant, lease, cap, ttl):
                    return
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(freed.wait(), min(poll, left))
                poll = min(poll * 2, POLL_MAX_S)
        except StateUnavailable as exc:
            raise state_error(exc) from None
        retry = max(math.ceil(self.settings.queue_timeout_s), 1)
        raise GatewayError(
            errors.QUEUE_TIMEOUT,
            f"no execution slot free within {self.settings.queue_timeout_s:g} s",
            headers={"Retry-After": str(retry)},
            retry_after_s=retry,
        )

    def _freed_event(self) -> asyncio.Event:
        if self._freed is None:
            self._freed = asyncio.Event()
        return self._freed

    async def charge_cpu(self, tenant: str, cpu_s: float) -> None:
        try:
            await self.state.charge_cpu(tenant, cpu_s)
        except StateUnavailable as exc:
            # The execution already ran; its result is not withheld for bookkeeping.
            log.warning("CPU usage of tenant %s not charged: %s", tenant, exc)

    async def _release(self, tenant: str, lease: str) -> None:
        self._held.pop(lease, None)
        try:
            await self.state.release(tenant, lease)
        except StateUnavailable as exc:
            log.warning("lease %s not released (it lapses on its own): %s", lease, exc)
        if self._freed is not None:
            # Wake every waiter here; the state decides which of them is next.
            self._freed.set()
            self._freed = None

    @staticmethod
    def _refuse(refusal: Refusal, limits: TenantSettings) -> GatewayError:
        kind, message = _MESSAGES[refusal.limit]
        retry = max(math.ceil(refusal.retry_s), 1)
        headers = {
            "Retry-After": str(retry),
            "RateLimit-Policy": policy_header(limits),
            "RateLimit": f'"{refusal.limit}";r=0;t={retry}',
        }
        return GatewayError(
            kind, message, headers=headers, retry_after_s=retry, limit=refusal.limit
        )


def tenant_label(settings: Settings, tenant: str) -> str:
    """A metric label bounded by configuration: configured tenants by name, the rest `other`."""
    return tenant if tenant in settings.tenants and tenant != "default" else "other"
