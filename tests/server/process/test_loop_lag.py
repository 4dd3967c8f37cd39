"""The event loop's lag, as the serving process measures it and `/metrics` shows it: a tick due
every `TICK_SECONDS` records how late it ran, in a histogram since start and a maximum of the
last minute (proxy/server/process/loop_lag.py). A loop of our own making keeps time here, so what
is asserted is the arithmetic, never the machine's speed."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from proxy.server.process.loop_lag import TICK_SECONDS, WINDOW_SECONDS, LoopLag, LoopWatch


class SteppedLoop:
    """The two calls `LoopWatch` makes of an event loop, with a clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0
        self.due: list[tuple[float, object]] = []

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback):  # the loop's own signature
        handle = Handle(when, callback)
        self.due.append((when, handle))
        return handle

    def run_due_at(self, now: float) -> None:
        """The loop gets round to what was due, at `now` (later than due when it was held)."""
        self.now = now
        ready, self.due = [h for w, h in self.due if w <= now], [(w, h) for w, h in self.due if w > now]
        for handle in ready:
            if not handle.cancelled:
                handle.callback()


class Handle:
    def __init__(self, when: float, callback) -> None:
        self.when, self.callback, self.cancelled = when, callback, False

    def cancel(self) -> None:
        self.cancelled = True


def rendered(lag: LoopLag) -> str:
    registry = CollectorRegistry()
    registry.register(lag)
    return generate_latest(registry).decode()


class TestLoopWatch:
    def test_a_tick_run_late_records_how_late(self):
        loop, lag = SteppedLoop(), LoopLag()
        watch = LoopWatch(lag, loop)  # type: ignore[arg-type]
        watch.start()
        loop.run_due_at(100.0 + TICK_SECONDS)  # on time
        loop.run_due_at(loop.now + TICK_SECONDS + 0.25)  # the loop was held a quarter of a second
        assert lag.recent_max == 0.25
        assert sum(lag.counts) == 2

    def test_the_next_tick_is_due_an_interval_after_the_last_ran(self):
        loop, lag = SteppedLoop(), LoopLag()
        LoopWatch(lag, loop).start()  # type: ignore[arg-type]
        loop.run_due_at(101.0)  # held a second: one late tick, not fifty
        assert [when for when, _ in loop.due] == [101.0 + TICK_SECONDS]

    def test_a_stopped_watch_ticks_no_more(self):
        loop, lag = SteppedLoop(), LoopLag()
        watch = LoopWatch(lag, loop)  # type: ignore[arg-type]
        watch.start()
        watch.stop()
        loop.run_due_at(105.0)
        assert sum(lag.counts) == 0


class TestLoopLag:
    def test_the_histogram_and_the_maximum_are_rendered_for_prometheus(self):
        lag = LoopLag()
        for seconds in (0.001, 0.004, 0.12):
            lag.observe(seconds, now=1.0)
        text = rendered(lag)
        assert 'context_guard_event_loop_lag_seconds_bucket{le="0.002"} 1.0' in text
        assert 'context_guard_event_loop_lag_seconds_bucket{le="0.1"} 2.0' in text
        assert 'context_guard_event_loop_lag_seconds_bucket{le="0.15"} 3.0' in text
        assert "context_guard_event_loop_lag_seconds_count 3.0" in text
        assert "context_guard_event_loop_lag_max_seconds 0.12" in text

    def test_the_maximum_keeps_the_last_minute_only(self):
        lag = LoopLag()
        lag.observe(0.5, now=0.0)
        lag.observe(0.01, now=WINDOW_SECONDS)  # a new window: the one before still counts
        assert lag.recent_max == 0.5
        lag.observe(0.01, now=2 * WINDOW_SECONDS)
        assert lag.recent_max == 0.01

    def test_a_quiet_spell_longer_than_both_windows_forgets_the_old_maximum(self):
        lag = LoopLag()
        lag.observe(0.5, now=0.0)
        lag.observe(0.01, now=5 * WINDOW_SECONDS)
        assert lag.recent_max == 0.01

    def test_the_loops_own_cpu_between_ticks_is_kept_apart_from_its_lateness(self):
        """A tick late by 0.3 s while the loop worked 0.02 s of it: the rest was spent waiting (for a
        core, or for the GIL)."""
        lag = LoopLag()
        lag.observe(0.3, now=1.0, busy=0.02)
        assert (lag.recent_max, lag.recent_busy_max) == (0.3, 0.02)
        assert "context_guard_event_loop_busy_max_seconds 0.02" in rendered(lag)

    def test_forgetting_the_recent_maximum_keeps_the_histogram(self):
        """Once ready, the stalls of the start (vocabularies loading) leave the maximum."""
        lag = LoopLag()
        lag.observe(0.3, now=0.0, busy=0.3)
        lag.forget_recent()
        lag.observe(0.002, now=1.0)
        assert lag.recent_max == 0.002 and lag.recent_busy_max == 0.0
        assert sum(lag.counts) == 2 and lag.total == 0.302
