"""The cyclic garbage collector around a large body's work, so that it does not stall the loop.

A 10 MB body parsed and planned in a thread makes a few hundred thousand objects that stay alive
for the whole request. While they are made, CPython's collector runs again and again (every 700
allocations) and walks them each time: young collections of 7-13 ms, and full ones of 50-90 ms
once enough of them have survived into the oldest generation. The collector holds the GIL
throughout, in whichever thread triggered it, so the event loop and every small request wait
(bench/changes.md, "Isolation and workers").

`CollectorPause.around(work)` runs the work with automatic collection off and, when it ends,
moves every object then tracked into the collector's permanent generation (`gc.freeze()`, a
splice of lists, not a walk): those objects are freed by reference counting as usual when the
request lets go of them, but no collection walks them again. The cost is that a reference cycle
among objects frozen this way is not reclaimed while frozen: at the start of the first large
body's work at least `thaw_seconds` after the last one, they are handed back to the collector
(`gc.unfreeze()`) and one full collection runs, there, before the new body has made anything.
So such garbage is held for at most that long (plus one large body's work), and a full
collection happens at most once in that time instead of two to four times per body.

The pause is process-wide (CPython has one collector): overlapping works keep collection off
until the last one ends.

Between large bodies, a serving process collects its youngest generation every
`YOUNG_COLLECTION_EVERY` container allocations instead of CPython's 700
(`collect_young_less_often`, called once by the serving process): a request allocates
thousands (its new JSON values, aiohttp's request and response objects), and the requests in
flight keep theirs alive, so at 700 each young collection walked the live objects of every
request in flight, several times per request, to free almost nothing (reference counting frees
a request's objects; the collector is there for cycles). At 32 clients sending warm 88 KB
bodies, the collector took 0.73 s of a 16 s run at 700 and 0.07 s at 10,000 (bench/changes.md).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

THAW_SECONDS = 30.0
YOUNG_COLLECTION_EVERY = 10_000


def collect_young_less_often() -> None:
    """The youngest generation collected every `YOUNG_COLLECTION_EVERY` allocations (see above);
    the older generations keep their thresholds, so each is still collected once per as many
    young collections as before."""
    young, *older = gc.get_threshold()
    gc.set_threshold(max(young, YOUNG_COLLECTION_EVERY), *older)


class CollectorPause:
    """Automatic collection off while large bodies are worked on; what they made is frozen after."""

    def __init__(self, thaw_seconds: float = THAW_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        if not thaw_seconds > 0:
            raise ValueError(f"thaw_seconds must be positive, not {thaw_seconds!r}")
        self.thaw_seconds = thaw_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._active = 0
        self._was_enabled = True
        self._thawed_at = clock()
        self.freezes = 0  # for tests and the curious: how often the work's objects were frozen
        self.thaws = 0

    @property
    def active(self) -> int:
        """How many large bodies are being worked on now."""
        return self._active

    def around(self, work: Callable[..., T], *args: Any) -> T:
        """`work()` with automatic collection off and its objects frozen afterwards; first, when the
        last hand-back is `thaw_seconds` old, the frozen objects go back and are collected."""
        self._enter()
        try:
            return work(*args)
        finally:
            self._exit()

    def _enter(self) -> None:
        with self._lock:
            if self._active == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._active += 1
            now = self._clock()
            if now - self._thawed_at >= self.thaw_seconds:
                # Before this body makes anything: what was frozen goes back, and one full
                # collection reclaims what became garbage since (also when works overlap for so
                # long that automatic collection never came back on).
                gc.unfreeze()
                gc.collect()
                self._thawed_at = now
                self.thaws += 1

    def _exit(self) -> None:
        with self._lock:
            self._active -= 1
            if self._active:
                return
            gc.freeze()
            self.freezes += 1
            if self._was_enabled:
                gc.enable()
