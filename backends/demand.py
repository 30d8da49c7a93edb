"""Which languages the pool of sandboxes made ahead should hold, from recent demand.

(`split`, the largest-remainder sharing, also divides the docker pool by shape.)

A sandbox made ahead already runs its language's interpreter, so the pool is
split by language: each language gets a share of `warm_pool_size` in
proportion to its requests in the last `window_s` seconds (largest remainder,
ties to the language asked for last). Before any request, or after a quiet
window, the whole pool goes to the default language.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Hashable, Mapping
from typing import TypeVar

K = TypeVar("K", bound=Hashable)

WINDOW_S = 60.0
# Enough to follow a mix; older entries are dropped with the window anyway.
MAX_ENTRIES = 1024


class Demand:
    """The requests of the last `window_s` seconds (at most MAX_ENTRIES), counted
    as they come and go: the pool asks for its shares after every execution."""

    def __init__(
        self, window_s: float = WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.window_s = window_s
        self.clock = clock
        self._seen: collections.deque[tuple[float, str]] = collections.deque()
        self._counts: collections.Counter[str] = collections.Counter()
        # Each language's latest request, as a running number: the tie-break.
        self._last: dict[str, int] = {}
        self._number = 0

    def record(self, language: str) -> None:
        if len(self._seen) >= MAX_ENTRIES:
            self._forget()
        self._seen.append((self.clock(), language))
        self._counts[language] += 1
        self._number += 1
        self._last[language] = self._number

    def recent(self) -> collections.Counter[str]:
        horizon = self.clock() - self.window_s
        while self._seen and self._seen[0][0] < horizon:
            self._forget()
        return collections.Counter(self._counts)

    def shares(self, size: int, default: str) -> dict[str, int]:
        """How many sandboxes of each language to hold (summing to `size`)."""
        counts = self.recent()
        if size > 0 and not counts:
            return {default: size}
        return split(size, counts, self._last)

    def _forget(self) -> None:
        _, language = self._seen.popleft()
        self._counts[language] -= 1
        if not self._counts[language]:
            del self._counts[language]
            del self._last[language]


def split(size: int, counts: Mapping[K, int], last: Mapping[K, int]) -> dict[K, int]:
    """`size` places shared in proportion to `counts` (largest remainder; ties to
    the key with the highest `last`, the one asked for most recently); keys that get
    none are left out."""
    total = sum(counts.values())
    if size <= 0 or not total:
        return {}
    exact = {key: size * n / total for key, n in counts.items()}
    shares = {key: int(value) for key, value in exact.items()}
    by_remainder = sorted(exact, key=lambda k: (exact[k] - shares[k], last[k]), reverse=True)
    for key in by_remainder[: size - sum(shares.values())]:
        shares[key] += 1
    return {key: n for key, n in shares.items() if n}
