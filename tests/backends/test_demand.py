"""The pool's share per language follows the requests of the last window."""

from __future__ import annotations

from backends.demand import Demand


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
