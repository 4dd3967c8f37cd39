"""Prometheus metrics for one app, in a registry of its own (so tests can run many apps)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "context_guard_requests",
            "Requests handled, by route kind, outcome and status.",
            ["kind", "outcome", "status"],
            registry=r,
        )
        self.trims = Counter("context_guard_trims", "Chat requests that were cut to fit.", ["model"], registry=r)
        self.tokens_removed = Counter(
            "context_guard_tokens_removed", "Prompt tokens removed by trimming.", ["model"], registry=r
        )
        self.rejections = Counter(
            "context_guard_rejections", "Chat requests rejected as too long to fit.", ["model"], registry=r
        )
        self.upstream_errors = Counter(
            "context_guard_upstream_errors",
            "Upstream failures, by upstream and kind.",
            ["upstream", "kind"],
            registry=r,
        )
        self.corrections = Counter(
            "context_guard_self_corrections",
            "Retries after an upstream still found the context too long.",
            ["model", "result"],
            registry=r,
        )
        self.duration = Histogram(
            "context_guard_duration_seconds",
            "Time spent, by phase (count, trim, upstream, total).",
            ["phase"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)
