"""LimitState on Redis: every gateway replica sees the same counters and leases.

Each check is one Lua script (gateway/state/lua/), loaded once and run by EVALSHA,
so a decision and what it spends are atomic across replicas; scripts read Redis's
own clock, so replicas need not agree on time. Leases (concurrency, global slots)
carry an expiry that the holding replica renews while the execution runs: a dead
replica's leases lapse by themselves. Any Redis error is StateUnavailable (fail
closed); requests are never admitted on a guess.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from gateway.state.base import Quota, Refusal, StateUnavailable, Usage
from gateway.state.memory import WAIT_TTL_S

_LUA = Path(__file__).with_name("lua")
PREFIX = "execgate:"


def lua_script(name: str) -> str:
    return (_LUA / f"{name}.lua").read_text(encoding="utf-8")


class RedisState:
    def __init__(self, url: str, timeout_s: float = 0.5) -> None:
        # Short socket timeouts: a stalled Redis must fail requests fast, not hang them.
        self.client = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            health_check_interval=0,
        )
        self._admit = self.client.register_script(lua_script("admit"))
        self._rate = self.client.register_script(lua_script("rate"))
        self._usage = self.client.register_script(lua_script("usage"))
        self._charge = self.client.register_script(lua_script("charge"))
        self._slot = self.client.register_script(lua_script("slot"))
        self._renew = self.client.register_script(lua_script("renew"))
        self._claim = self.client.register_script(lua_script("claim"))

    async def run(self, call: Any) -> Any:
        try:
            return await call
        except (RedisError, OSError) as exc:
            raise StateUnavailable(f"redis: {type(exc).__name__}: {exc}") from exc

    async def start(self) -> None:
        await self.run(self.client.ping())

    async def close(self) -> None:
        await self.client.aclose()

    async def health(self) -> tuple[bool, str]:
        try:
            await self.run(self.client.ping())
        except StateUnavailable as exc:
            return False, str(exc)
        return True, ""

    @staticmethod
    def _keys(tenant: str) -> list[str]:
        return [f"{PREFIX}{kind}:{tenant}" for kind in ("tat", "day", "cpu", "leases")]

    async def admit(self, tenant: str, quota: Quota, lease: str, ttl_s: float) -> Refusal | None:
        args = [
            quota.rate_per_s,
            quota.burst,
            quota.max_concurrent,
            quota.cpu_s_per_hour,
            quota.executions_per_day,
            lease,
            ttl_s,
        ]
        verdict, retry = await self.run(self._admit(keys=self._keys(tenant), args=args))
        verdict = verdict.decode()
        if verdict == "ok":
            return None
        return Refusal(verdict, float(retry))  # type: ignore[arg-type]

    async def spend_rate(self, tenant: str, quota: Quota) -> Refusal | None:
        keys = [f"{PREFIX}tat:{tenant}"]
        verdict, retry = await self.run(self._rate(keys=keys, args=[quota.rate_per_s, quota.burst]))
        return None if verdict.decode() == "ok" else Refusal("rate", float(retry))

    async def usage(self, tenant: str, quota: Quota) -> Usage:
        live, cpu, count, remaining = await self.run(
            self._usage(keys=self._keys(tenant), args=[quota.rate_per_s, quota.burst])
        )
        return Usage(int(live), round(float(cpu), 3), int(count), int(remaining))

    async def charge_cpu(self, tenant: str, cpu_s: float) -> None:
        if cpu_s > 0:
            await self.run(self._charge(keys=[f"{PREFIX}cpu:{tenant}"], args=[cpu_s]))

    async def take_slot(self, tenant: str, lease: str, cap: int, ttl_s: float) -> bool:
        keys = [f"{PREFIX}slots", f"{PREFIX}waiting"]
        args = [tenant, lease, cap, ttl_s, WAIT_TTL_S]
        return bool(await self.run(self._slot(keys=keys, args=args)))

    async def stop_waiting(self, tenant: str, lease: str) -> None:
        await self.run(self.client.zrem(f"{PREFIX}waiting", f"{tenant}|{lease}"))

    async def release(self, tenant: str, lease: str) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.zrem(f"{PREFIX}leases:{tenant}", lease)
        pipe.zrem(f"{PREFIX}slots", f"{tenant}|{lease}")
        pipe.zrem(f"{PREFIX}waiting", f"{tenant}|{lease}")
        await self.run(pipe.execute())

    async def renew(self, leases: list[tuple[str, str]], ttl_s: float) -> None:
        keys: list[str] = []
        args: list[Any] = [ttl_s]
        for tenant, lease in leases:
            keys += [f"{PREFIX}leases:{tenant}", f"{PREFIX}slots"]
            args += [lease, f"{tenant}|{lease}"]
        if keys:
            await self.run(self._renew(keys=keys, args=args))

    async def spend_once(self, key: str, ttl_s: float) -> bool:
        ttl_ms = max(int(ttl_s * 1000), 1)
        done = await self.run(self.client.set(f"{PREFIX}spent:{key}", b"1", nx=True, px=ttl_ms))
        return bool(done)

    async def claim_once(self, key: str, value: str, ttl_s: float) -> str | None:
        ttl_ms = max(int(ttl_s * 1000), 1)
        name = f"{PREFIX}claim:{key}"
        held = await self.run(self._claim(keys=[name], args=[value, ttl_ms]))
        return None if held is None else bytes(held).decode()
