"""The barrier's pinned marker threads (backends/capture/markers.py).

Real threads and real affinities; the tracer that reads the markers is in
test_host_tracer.py (a record stays complete after a marker thread was moved)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from backends.capture.markers import CpuMarkers, online_cpus
from tests.components import missing_component


def allowed_cpus() -> list[int]:
    return sorted(set(online_cpus()) & os.sched_getaffinity(0))


def until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


@pytest.fixture
def missed() -> list[tuple[int, int]]:
    return []


@pytest.fixture
def markers(missed: list[tuple[int, int]]) -> Iterator[CpuMarkers]:
    lock = threading.Lock()

    def note(ns: int, cpu: int) -> None:
        with lock:
            missed.append((ns, cpu))

    made = CpuMarkers(note)
    yield made
    made.close()


def test_each_cpu_gets_a_thread_pinned_to_it(markers: CpuMarkers) -> None:
    markers.start(online_cpus())
    assert markers.cpus == frozenset(allowed_cpus())
    for cpu, thread in markers.threads.items():
        assert thread.is_alive()
        assert thread.native_id is not None
        assert os.sched_getaffinity(thread.native_id) == {cpu}
    # The starting thread's own affinity is untouched.
    assert os.sched_getaffinity(0) >= set(allowed_cpus())


def test_a_cpu_the_process_may_not_use_is_left_out(markers: CpuMarkers) -> None:
    before = threading.active_count()
    markers.start([*allowed_cpus(), 4095])
    assert 4095 not in markers.cpus and markers.cpus == frozenset(allowed_cpus())
    # Its thread did not stay behind.
    until(lambda: threading.active_count() == before + len(markers.cpus), "the thread to end")


def test_a_thread_moved_off_its_cpu_goes_back_before_it_marks(
    markers: CpuMarkers, missed: list[tuple[int, int]]
) -> None:
    cpus = allowed_cpus()
    if len(cpus) < 2:
        missing_component("a second CPU: with one there is nowhere to move a thread to")
    markers.start(cpus)
    cpu, thread = sorted(markers.threads.items())[0]
    assert thread.native_id is not None
    os.sched_setaffinity(thread.native_id, {cpus[1]})  # from outside, as a cpuset change
    assert markers.barrier(1234) == frozenset(cpus)
    until(lambda: os.sched_getaffinity(thread.native_id) == {cpu}, "the thread to go back")
    assert missed == []


class CpusGoAway(CpuMarkers):
    """Pins each thread once; at the first barrier its CPU is gone (a cpuset shrank
    under the gateway). test_host.py hands it to a tracer."""

    def __init__(self, missed: Callable[[int, int], None]) -> None:
        super().__init__(missed)
        self.pinned: set[int] = set()

    def pin(self, cpu: int) -> None:
        if cpu in self.pinned:
            raise OSError(22, "Invalid argument")
        super().pin(cpu)
        self.pinned.add(cpu)


def test_a_cpu_that_can_no_longer_be_marked_is_reported_not_waited_for() -> None:
    missed: list[tuple[int, int]] = []
    markers = CpusGoAway(lambda ns, cpu: missed.append((ns, cpu)))
    markers.start(allowed_cpus())
    try:
        markers.barrier(77)
        until(lambda: len(missed) == len(markers.cpus), "every CPU reported")
        assert sorted(missed) == [(77, cpu) for cpu in sorted(markers.cpus)]
    finally:
        markers.close()


def test_close_ends_every_thread(markers: CpuMarkers) -> None:
    markers.start(allowed_cpus())
    threads = list(markers.threads.values())
    markers.barrier(5)
    markers.close()
    assert not any(t.is_alive() for t in threads)
    assert markers.cpus == frozenset() and markers.barrier(6) == frozenset()
