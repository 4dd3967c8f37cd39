"""How late the event loop runs, measured in the serving process and exposed as metrics.

One event loop serves every request of a worker, `/livez` included: work that holds it (a
vocabulary built while holding the GIL, a body read in one piece) delays them all. `LoopWatch`
schedules a callback every `TICK_SECONDS` and records how late each one ran (`loop.time()` at the
call minus the time it was due): a loop that is free runs it within a millisecond, one held for
200 ms runs it up to 200 ms late. A tick costs a few microseconds; at 50 a second that is well
under 0.1% of a core.

`LoopLag` keeps what the ticks saw and renders it for `/metrics`:
- `context_guard_event_loop_lag_seconds`, a histogram of every tick's lateness since start;
- `context_guard_event_loop_lag_max_seconds`, the largest lateness of the last minute (kept in two
  slots of `WINDOW_SECONDS`: what it shows is at most twice that old) since the process became
  ready, for an alert on a stall that the histogram's rate would average away.
Only the event loop writes them, so neither takes a lock.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

TICK_SECONDS = 0.02
WINDOW_SECONDS = 30.0
BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class LoopLag:
    """The ticks' lateness: a histogram since start and the maximum of the last one or two windows."""

    def __init__(self) -> None:
        self.bounds = (*BUCKETS, float("inf"))
        self.labels = [floatToGoString(bound) for bound in self.bounds]  # type: ignore[no-untyped-call]  # untyped library
        self.counts = [0] * len(self.bounds)
        self.total = 0.0
        self._slot_started: float | None = None
        self._current = 0.0  # the largest lateness of the window that runs now
        self._previous = 0.0  # and of the one before it

    def observe(self, seconds: float, now: float) -> None:
        """One tick that ran `seconds` late at loop time `now`."""
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.total += seconds
        if self._slot_started is None:
            self._slot_started = now
        elif now - self._slot_started >= WINDOW_SECONDS:
            stale = now - self._slot_started >= 2 * WINDOW_SECONDS  # no tick for a whole window
            self._previous, self._current, self._slot_started = (0.0 if stale else self._current), 0.0, now
        self._current = max(self._current, seconds)

    def forget_recent(self) -> None:
        """Start the recent maximum afresh: once the process is ready, so that it shows the stalls of
        serving (those of its start, while vocabularies load, stay in the histogram)."""
        self._current = self._previous = 0.0
        self._slot_started = None

    @property
    def recent_max(self) -> float:
        return max(self._current, self._previous)

    def collect(self) -> Iterator[Metric]:
        histogram = HistogramMetricFamily(
            "context_guard_event_loop_lag_seconds",
            f"How late the event loop ran a callback due every {TICK_SECONDS:g} s (work holding the loop).",
        )
        cumulative, running = [], 0
        for label, count in zip(self.labels, self.counts, strict=True):
            running += count
            cumulative.append((label, float(running)))
        histogram.add_metric([], cumulative, self.total)
        yield histogram
        yield GaugeMetricFamily(
            "context_guard_event_loop_lag_max_seconds",
            "The longest the event loop ran late in the last minute.",
            value=self.recent_max,
        )


class LoopWatch:
    """A callback every `every` seconds on `loop`, each reporting to `lag` how late it ran."""

    def __init__(self, lag: LoopLag, loop: asyncio.AbstractEventLoop, every: float = TICK_SECONDS) -> None:
        self.lag, self.loop, self.every = lag, loop, every
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0

    def start(self) -> None:
        self._due = self.loop.time() + self.every
        self._handle = self.loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self) -> None:
        now = self.loop.time()
        self.lag.observe(max(0.0, now - self._due), now)
        self._due = now + self.every
        self._handle = self.loop.call_at(self._due, self._tick)
