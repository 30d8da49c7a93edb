"""Failed console sign-ins, rate-limited per source address (GCRA, bounded memory).

Every refused token costs its source one `INTERVAL_S`; a source may run `BURST`
failures ahead of that rate, after which it must wait before it may try again
(429 with Retry-After). Sign-in charges each attempt up front and refunds it on
success, so successful sign-ins cost nothing and forgive nothing.
IPv6 sources are keyed by their /64, which one attacker usually holds whole.
The table keeps at most `MAX_SOURCES` entries: sources that have fully recovered
go first, then the least recently refused, so memory stays bounded even when
addresses are plentiful (a flood of fresh addresses can push an old one out early;
each fresh address still gets only `BURST` guesses).
"""

from __future__ import annotations

import ipaddress
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

BURST = 5
INTERVAL_S = 30.0  # after the burst: one more try per this many seconds
MAX_SOURCES = 10_000


@dataclass(slots=True)
class _Source:
    tat: float  # GCRA's theoretical arrival time of the next failure
    reported: bool = False  # this throttled spell has its audit record already


def source_key(remote: str | None) -> str:
    try:
        address = ipaddress.ip_address(remote or "")
    except ValueError:
        return remote or "unknown"
    if address.version == 4:
        return str(address)
    if address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(ipaddress.ip_network(f"{address}/64", strict=False))


class SignInThrottle:
    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        burst: int = BURST,
        interval_s: float = INTERVAL_S,
        max_sources: int = MAX_SOURCES,
    ) -> None:
        self._clock = clock
        self._interval_s = interval_s
        self._tolerance_s = (burst - 1) * interval_s
        self._max_sources = max_sources
        self._sources: OrderedDict[str, _Source] = OrderedDict()

    def retry_after_s(self, key: str) -> float:
        """0 if `key` may try now, else how long it must wait."""
        entry = self._sources.get(key)
        if entry is None:
            return 0.0
        wait = entry.tat - self._clock() - self._tolerance_s
        if wait <= 0:
            entry.reported = False
            return 0.0
        return wait

    def first_refusal(self, key: str) -> bool:
        """True once per throttled spell: the refusal worth an audit record."""
        entry = self._sources.get(key)
        if entry is None or entry.reported:
            return False
        entry.reported = True
        return True

    def failed(self, key: str) -> None:
        now = self._clock()
        entry = self._sources.pop(key, None)
        if entry is None:
            self._make_room(now)
            entry = _Source(now)
        entry.tat = max(entry.tat, now) + self._interval_s
        self._sources[key] = entry  # most recently refused last

    def refund(self, key: str) -> None:
        """Take back one `failed` charge (the attempt succeeded)."""
        entry = self._sources.get(key)
        if entry is not None:
            entry.tat -= self._interval_s

    def __len__(self) -> int:
        return len(self._sources)

    def _make_room(self, now: float) -> None:
        if len(self._sources) < self._max_sources:
            return
        for key in [k for k, e in self._sources.items() if e.tat <= now]:
            del self._sources[key]
        while len(self._sources) >= self._max_sources:
            self._sources.popitem(last=False)


THROTTLE = web.AppKey("console_signin_throttle", SignInThrottle)
