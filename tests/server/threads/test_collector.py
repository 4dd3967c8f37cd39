"""The garbage collector around a large body's work: off while it runs, its objects frozen after,
handed back to the collector once `thaw_seconds` have passed."""

from __future__ import annotations

import contextlib
import gc
import subprocess
import sys
import threading
import weakref
from collections.abc import Iterator

import pytest

from proxy.server.threads.collector import CollectorPause
from tests.support.clock import ManualClock


class Node:
    """A container the collector tracks (it can be part of a reference cycle)."""

    def __init__(self) -> None:
        self.other: Node | None = None


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()
    else:
        gc.disable()


def cycle() -> Node:
    """Two nodes that refer to each other: only the collector can reclaim them."""
    a, b = Node(), Node()
    a.other, b.other = b, a
    return a


@contextlib.contextmanager
def work_in_another_thread(pause: CollectorPause) -> Iterator[None]:
    """A large body's work running in another thread for as long as the block runs."""
    started, release = threading.Event(), threading.Event()

    def long_work() -> None:
        started.set()
        release.wait(5)

    worker = threading.Thread(target=pause.around, args=(long_work,))
    worker.start()
    started.wait(5)
    try:
        yield
    finally:
        release.set()
        worker.join(5)


def walked(obj: object) -> bool:
    """Whether a collection would walk `obj` (it is in one of the three generations, not frozen)."""
    return any(o is obj for o in gc.get_objects())


class TestCollectorPause:
    def test_automatic_collection_is_off_while_the_work_runs_and_on_again_after(self):
        gc.enable()
        seen = CollectorPause().around(gc.isenabled)
        assert seen is False
        assert gc.isenabled()

    def test_the_objects_the_work_made_are_not_walked_by_later_collections(self):
        made = CollectorPause().around(Node)
        assert gc.is_tracked(made) and not walked(made)

    def test_a_frozen_object_is_still_freed_when_its_last_reference_goes(self):
        made = CollectorPause().around(Node)
        freed = threading.Event()
        gc_count = gc.get_freeze_count()
        weakref.finalize(made, freed.set)
        del made
        assert freed.is_set() and gc.get_freeze_count() < gc_count

    def test_overlapping_works_keep_collection_off_until_the_last_one_ends(self):
        gc.enable()
        pause = CollectorPause()
        with work_in_another_thread(pause):
            pause.around(lambda: None)
            assert not gc.isenabled() and pause.active == 1
        assert gc.isenabled() and pause.active == 0

    def test_the_next_work_once_thaw_seconds_have_passed_hands_the_frozen_objects_back_and_reclaims_a_cycle(self):
        clock = ManualClock(0.0)
        pause = CollectorPause(thaw_seconds=30, clock=clock)
        made = pause.around(cycle)
        gone = threading.Event()
        weakref.finalize(made, gone.set)
        del made
        gc.collect()
        assert not gone.is_set()  # frozen: the cycle is kept
        clock.now = 30.0
        pause.around(lambda: None)
        assert gone.is_set() and pause.thaws == 1

    def test_garbage_is_reclaimed_even_when_works_overlap_for_longer_than_thaw_seconds(self):
        clock = ManualClock(0.0)
        pause = CollectorPause(thaw_seconds=30, clock=clock)
        with work_in_another_thread(pause):
            gone = threading.Event()
            weakref.finalize(cycle(), gone.set)  # garbage at once, while collection is off
            clock.now = 30.0
            pause.around(lambda: None)
            assert gone.is_set() and not gc.isenabled()

    def test_collection_stays_off_after_the_work_when_it_was_off_before(self):
        gc.disable()
        CollectorPause().around(lambda: None)
        assert not gc.isenabled()

    def test_a_work_that_raises_still_turns_collection_back_on(self):
        gc.enable()

        def failing() -> None:
            raise ValueError("bad body")

        with pytest.raises(ValueError, match="bad body"):
            CollectorPause().around(failing)
        assert gc.isenabled()

    def test_a_thaw_period_that_is_not_positive_is_refused(self):
        with pytest.raises(ValueError, match="thaw_seconds"):
            CollectorPause(thaw_seconds=0)


def test_a_serving_process_collects_its_young_generation_every_ten_thousand_allocations() -> None:
    """In a fresh interpreter (the thresholds are process-wide): CPython's 700 becomes 10,000, the
    older generations' thresholds stay as they were."""
    script = (
        "import gc\n"
        "from proxy.server.threads.collector import collect_young_less_often\n"
        "before = gc.get_threshold()\n"
        "collect_young_less_often()\n"
        "print(before, gc.get_threshold())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.split(") (") == ["(700, 10, 10", "10000, 10, 10)\n"]
