"""The pool's share per language follows the requests of the last window."""

from __future__ import annotations

import collections
import random

from backends.demand import MAX_ENTRIES, Demand, split


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_before_any_request_the_default_language_has_the_pool() -> None:
    assert Demand().shares(2, "python") == {"python": 2}
    assert Demand().shares(0, "python") == {}


def test_shares_are_proportional_and_sum_to_the_pool() -> None:
    clock = Clock()
    demand = Demand(clock=clock)
    for language in ["bash"] * 6 + ["python"] * 3 + ["javascript"]:
        demand.record(language)
    shares = demand.shares(4, "python")
    assert sum(shares.values()) == 4
    assert shares == {"bash": 2, "python": 1, "javascript": 1} or shares == {
        "bash": 3,
        "python": 1,
    }
    for size in range(0, 9):
        assert sum(demand.shares(size, "python").values()) == size


def test_a_tie_goes_to_the_language_asked_for_last() -> None:
    clock = Clock()
    demand = Demand(clock=clock)
    demand.record("python")
    demand.record("bash")
    assert demand.shares(1, "python") == {"bash": 1}
    demand.record("python")
    assert demand.shares(1, "python") == {"python": 1}


def test_requests_older_than_the_window_are_forgotten() -> None:
    clock = Clock()
    demand = Demand(window_s=60, clock=clock)
    demand.record("bash")
    clock.now += 30
    demand.record("python")
    assert demand.shares(2, "python") == {"bash": 1, "python": 1}
    clock.now += 31
    assert demand.shares(2, "python") == {"python": 2}
    clock.now += 60
    assert demand.shares(2, "javascript") == {"javascript": 2}


class Recount:
    """The shares recounted from scratch over the window each time (what Demand
    keeps counted as requests come and go)."""

    def __init__(self, window_s: float, clock: Clock) -> None:
        self.window_s, self.clock = window_s, clock
        self.seen: collections.deque[tuple[float, str]] = collections.deque(maxlen=MAX_ENTRIES)

    def record(self, language: str) -> None:
        self.seen.append((self.clock(), language))

    def shares(self, size: int, default: str) -> dict[str, int]:
        horizon = self.clock() - self.window_s
        while self.seen and self.seen[0][0] < horizon:
            self.seen.popleft()
        counts = collections.Counter(language for _, language in self.seen)
        if size > 0 and not counts:
            return {default: size}
        last = {language: i for i, (_, language) in enumerate(self.seen)}
        return split(size, counts, last)


def test_the_running_count_matches_a_recount() -> None:
    """Bursts past MAX_ENTRIES, quiet gaps past the window, ties: same shares."""
    rng = random.Random(18)
    clock = Clock()
    demand, recount = Demand(window_s=60, clock=clock), Recount(60, clock)
    languages = ["python", "bash", "javascript"]
    for step in range(8_000):
        roll = rng.random()
        if roll < 0.002:
            clock.now += rng.choice([59.0, 60.0, 61.0, 200.0])
        elif roll < 0.3:
            clock.now += rng.random() * 0.5
        language = rng.choice(languages[: 1 + step // 2000 % 3])
        demand.record(language)
        recount.record(language)
        size = rng.randrange(0, 7)
        default = rng.choice(languages)
        assert demand.shares(size, default) == recount.shares(size, default), step
        assert demand.recent() == collections.Counter(language for _, language in recount.seen)
