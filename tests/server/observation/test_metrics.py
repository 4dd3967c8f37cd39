"""The per-request series the event loop keeps itself are exposed as prometheus_client's own would be."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from proxy.server.observation.metrics import LoopCounter, PhaseDurations

BUCKETS = (0.001, 0.01, 0.1, 1.0)
PHASES = ("total", "upstream", "count", "trim")


def exposed(collector: object) -> bytes:
    registry = CollectorRegistry()
    registry.register(collector)  # type: ignore[arg-type]  # a collector by its `collect` method
    return generate_latest(registry)


class TestLoopCounter:
    def test_it_is_exposed_as_a_prometheus_counter_with_the_same_labels_and_counts(self):
        ours = LoopCounter("requests", "Requests.", ("kind", "status"))
        registry = CollectorRegistry()
        theirs = Counter("requests", "Requests.", ["kind", "status"], registry=registry)
        for labels in [("chat", "2xx"), ("chat", "2xx"), ("local", "4xx"), ("chat", "499")]:
            ours.inc(labels)
            theirs.labels(*labels).inc()
        assert exposed(ours) == generate_latest(registry)

    def test_it_adds_amounts_as_a_prometheus_counter_does(self):
        ours = LoopCounter("prompt_tokens", "Tokens.", ("model",))
        registry = CollectorRegistry()
        theirs = Counter("prompt_tokens", "Tokens.", ["model"], registry=registry)
        for model, amount in [("gpt-4o", 1200), ("other", 7), ("gpt-4o", 35)]:
            ours.inc((model,), amount)
            theirs.labels(model).inc(amount)
        assert exposed(ours) == generate_latest(registry)

    def test_it_reads_back_a_count_by_its_label_values(self):
        counts = LoopCounter("requests", "Requests.", ("kind",))
        counts.inc(("chat",))
        counts.inc(("chat",))
        assert (counts.value("chat"), counts.value("local")) == (2, 0)


class TestPhaseDurations:
    @pytest.mark.parametrize("seconds", [[], [0.0005, 0.001, 0.0011, 0.5, 1.0, 7.0, 0.0]])
    def test_it_is_exposed_as_a_prometheus_histogram_with_every_phase_from_the_start(self, seconds):
        ours = PhaseDurations("duration_seconds", "Time.", PHASES, BUCKETS)
        registry = CollectorRegistry()
        theirs = Histogram("duration_seconds", "Time.", ["phase"], buckets=BUCKETS, registry=registry)
        series = {phase: theirs.labels(phase) for phase in PHASES}
        for i, value in enumerate(seconds):
            ours.observe(PHASES[i % 2], value)
            series[PHASES[i % 2]].observe(value)
        assert exposed(ours) == generate_latest(registry)
