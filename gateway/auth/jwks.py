"""A JWKS key cache: fetched with aiohttp, refreshed when stale or on an unknown `kid`.

Refreshes are single-flight and at most one per `min_refresh_interval_s`, so a
flood of tokens with made-up `kid`s costs the JWKS server one request per
interval, not one per token. A failed refresh keeps serving the keys we have.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import aiohttp

from gateway.auth.keys import KeyConfigError, VerificationKey, keys_from_jwks
from gateway.json_codec import loads

log = logging.getLogger(__name__)


class JwksCache:
    def __init__(
        self,
        url: str,
        session: aiohttp.ClientSession,
        *,
        cache_s: float,
        min_refresh_interval_s: float = 10.0,
        timeout_s: float = 5.0,
        max_bytes: int = 1 << 20,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self._session = session
        self._cache_s = cache_s
        self._min_interval_s = min_refresh_interval_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._max_bytes = max_bytes
        self._clock = clock
        self._by_kid: dict[str, list[VerificationKey]] = {}
        self._kidless: list[VerificationKey] = []
        self._fetched_at: float | None = None  # last successful fetch
        self._attempted_at: float | None = None  # last attempt, successful or not
        self._inflight: asyncio.Task[bool] | None = None
        self.fetches = 0  # attempts, for metrics and tests
        self.last_error: str | None = None

    # --- lookups (no I/O) ---------------------------------------------------------

    def with_kid(self, kid: str) -> list[VerificationKey]:
        return self._by_kid.get(kid, [])

    def for_alg(self, alg: str) -> list[VerificationKey]:
        """Every key pinned to `alg`, for tokens that name no `kid`."""
        keys = [k for ks in self._by_kid.values() for k in ks if k.alg == alg]
        return keys + [k for k in self._kidless if k.alg == alg]

    @property
    def loaded(self) -> bool:
        return self._fetched_at is not None

    # --- refreshing ----------------------------------------------------------------

    async def start(self) -> None:
        """First fetch. Failure is logged, not raised: tokens for it fail until it works."""
        await self._refresh()

    async def refresh_for_unknown_kid(self) -> None:
        """Fetch again unless a fetch happened within the interval (then return at once)."""
        if self._inflight is None and self._rate_limited():
            return
        await self._refresh()

    def refresh_if_stale(self) -> None:
        """Start a background refresh when the cache is older than `cache_s`."""
        if self._inflight is not None or self._rate_limited():
            return
        if self._fetched_at is not None and self._clock() - self._fetched_at < self._cache_s:
            return
        self._start_refresh()

    async def settled(self) -> None:
        """Wait for a refresh in flight, if any (shutdown, tests)."""
        task = self._inflight
        if task is not None:
            await asyncio.gather(asyncio.shield(task), return_exceptions=True)

    async def close(self) -> None:
        task, self._inflight = self._inflight, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _rate_limited(self) -> bool:
        return (
            self._attempted_at is not None
            and self._clock() - self._attempted_at < self._min_interval_s
        )

    async def _refresh(self) -> bool:
        task = self._inflight or self._start_refresh()
        # Shielded: a request that gives up must not cancel everyone's refresh.
        return await asyncio.shield(task)

    def _start_refresh(self) -> asyncio.Task[bool]:
        self._attempted_at = self._clock()
        self.fetches += 1
        task = asyncio.create_task(self._fetch(), name="jwks-refresh")
        self._inflight = task
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[bool]) -> None:
        if self._inflight is task:
            self._inflight = None

    async def _fetch(self) -> bool:
        try:
            keys = keys_from_jwks(loads(await self._get(), where="JWKS"), self.url)
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyConfigError) as exc:
            self.last_error = f"{type(exc).__name__}: {exc}"
            log.warning(
                "JWKS refresh from %s failed (%s); keeping %d cached keys",
                self.url,
                self.last_error,
                sum(map(len, self._by_kid.values())) + len(self._kidless),
            )
            return False
        by_kid: dict[str, list[VerificationKey]] = {}
        kidless = []
        for key in keys:
            if key.kid is None:
                kidless.append(key)
            else:
                by_kid.setdefault(key.kid, []).append(key)
        self._by_kid, self._kidless = by_kid, kidless
        self._fetched_at = self._clock()
        self.last_error = None
        log.info("JWKS from %s: %d keys (%s)", self.url, len(keys), sorted(by_kid))
        return True

    async def _get(self) -> bytes:
        async with self._session.get(
            self.url, timeout=self._timeout, headers={"Accept": "application/json"}
        ) as resp:
            if resp.status != 200:
                raise ValueError(f"HTTP {resp.status}")
            body = bytearray()
            async for chunk in resp.content.iter_chunked(64 * 1024):
                body += chunk
                if len(body) > self._max_bytes:
                    raise ValueError(f"JWKS larger than {self._max_bytes} bytes")
            return bytes(body)
