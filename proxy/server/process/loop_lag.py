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
  ready, for an alert on a stall that the histogram's rate would average away;
- `context_guard_event_loop_busy_max_seconds`, likewise the most CPU the loop's thread spent
  between two ticks. Lateness also counts the time the loop waited for a core (a busy machine)
  or for the GIL (a thread's native call); this is the loop's own work alone, so the two apart say
  whether the guard or its machine held `/livez`.
Only the event loop writes them, so none takes a lock.

**Short turns under many connections.** In one turn the loop reads every socket that has data,
up to 256 KiB each (asyncio's read size): a hundred clients sending 2 MB at once made turns of
70-90 ms of the loop's own CPU, and `/livez`, which needs about three turns (accept, read,
answer), took 210-400 ms. Reading 16 KiB a socket kept those turns near 20 ms and `/livez` under
100 ms, but cost a warm 88 KB request 15% more CPU (six reads and six wake-ups of its handler
instead of one). So the reads are sized by the connections open (`read_size`), as each
connection opens and at each tick: together at most `TURN_READ_BYTES` a turn, each between 16
and 256 KiB; a few connections read as asyncio would.
"""

from __future__ import annotations

import asyncio
import asyncio.selector_events
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

TICK_SECONDS = 0.02
WINDOW_SECONDS = 30.0
BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class RecentMax:
    """The largest value of the last one or two windows of `WINDOW_SECONDS`."""

    def __init__(self) -> None:
        self._started: float | None = None
        self._current = 0.0  # the largest of the window that runs now
        self._previous = 0.0  # and of the one before it

    def add(self, value: float, now: float) -> None:
        if self._started is None:
            self._started = now
        elif now - self._started >= WINDOW_SECONDS:
            stale = now - self._started >= 2 * WINDOW_SECONDS  # nothing came for a whole window
            self._previous, self._current, self._started = (0.0 if stale else self._current), 0.0, now
        self._current = max(self._current, value)

    @property
    def value(self) -> float:
        return max(self._current, self._previous)


class LoopLag:
    """The ticks' lateness (a histogram since start, the recent maximum) and the loop's CPU between them."""

    def __init__(self) -> None:
        self.bounds = (*BUCKETS, float("inf"))
        self.labels = [floatToGoString(bound) for bound in self.bounds]  # type: ignore[no-untyped-call]  # untyped library
        self.counts = [0] * len(self.bounds)
        self.total = 0.0
        self._late, self._busy = RecentMax(), RecentMax()

    def observe(self, seconds: float, now: float, busy: float = 0.0) -> None:
        """One tick that ran `seconds` late at loop time `now`, the loop's thread having spent `busy`
        seconds of CPU since the tick before."""
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.total += seconds
        self._late.add(seconds, now)
        self._busy.add(busy, now)

    def forget_recent(self) -> None:
        """Start the recent maxima afresh: once the process is ready, so that they show the stalls
        of serving (those of its start, while vocabularies load, stay in the histogram)."""
        self._late, self._busy = RecentMax(), RecentMax()

    @property
    def recent_max(self) -> float:
        return self._late.value

    @property
    def recent_busy_max(self) -> float:
        return self._busy.value

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
        yield GaugeMetricFamily(
            "context_guard_event_loop_busy_max_seconds",
            "The most CPU the event loop's thread spent between two of its ticks in the last minute.",
            value=self.recent_busy_max,
        )


TURN_READ_BYTES = 2 * 1024 * 1024
MIN_READ_BYTES = 16 * 1024
MAX_READ_BYTES = 256 * 1024  # asyncio's own


def read_size(connections: int) -> int:
    """Bytes to read from a socket per turn with `connections` open: `TURN_READ_BYTES` shared
    among them, within 16 and 256 KiB."""
    return max(MIN_READ_BYTES, min(MAX_READ_BYTES, TURN_READ_BYTES // max(1, connections)))


def set_socket_read_size(size: int) -> None:
    """Make the event loop read at most `size` bytes from a socket per turn: the class attribute
    `max_size` of asyncio's socket transport (no public setting exists); with another loop, whose
    transport is not that one, nothing changes."""
    transport = getattr(asyncio.selector_events, "_SelectorSocketTransport", None)
    if transport is not None and isinstance(getattr(transport, "max_size", None), int):
        transport.max_size = size


def sized_reads_on_connect(made: Callable[..., None], connections: Callable[[], int]) -> Callable[..., None]:
    """`made` (the server's hook for a new connection), then the reads sized at once for the
    connections open: a burst of clients is read in short pieces from its first turn, not from
    the next tick."""

    def connection_made(*args: Any) -> None:
        made(*args)
        set_socket_read_size(read_size(connections()))

    return connection_made


class LoopWatch:
    """A callback every `every` seconds on `loop`, each reporting to `lag` how late it ran."""

    def __init__(self, lag: LoopLag, loop: asyncio.AbstractEventLoop, every: float = TICK_SECONDS) -> None:
        self.lag, self.loop, self.every = lag, loop, every
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._cpu = 0.0  # the loop thread's CPU time at the last tick
        self.connections: Callable[[], int] | None = None  # how many the server holds: sizes the reads

    def start(self) -> None:
        self._cpu = time.thread_time()
        self._due = self.loop.time() + self.every
        self._handle = self.loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _tick(self) -> None:
        now, cpu = self.loop.time(), time.thread_time()
        self.lag.observe(max(0.0, now - self._due), now, cpu - self._cpu)
        self._cpu = cpu
        if self.connections is not None:
            set_socket_read_size(read_size(self.connections()))
        self._due = now + self.every
        self._handle = self.loop.call_at(self._due, self._tick)
