"""Prometheus metrics for one app, in a registry of its own (so tests can run many apps).

Every series is bounded: the `model` label is a configured or known model name (the model map's
key it resolved to), or `other`, never the raw name a client sent; upstreams come from the
config. `_created` series are off, and the standard `process_*` metrics are on.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from proxy.server.record import RequestRecord
from proxy.state.store import StateStatus

prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]  # the library's own API, untyped

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_STATUS_CLASSES = {1: "1xx", 2: "2xx", 3: "3xx", 4: "4xx", 5: "5xx"}


class Metrics:
    def __init__(
        self, model_label: Callable[[str | None], str], state: Callable[[], StateStatus] | None = None
    ) -> None:
        self.model_label = model_label
        self.state_status = state  # re-pointed when a reload opens another store
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)
        self.requests = Counter(
            "context_guard_requests",
            "Requests handled, by kind (API, passthrough, local), outcome and status.",
            ["kind", "outcome", "status"],
            registry=r,
        )
        self.trims = Counter("context_guard_trims", "Requests that were cut to fit.", ["model"], registry=r)
        self.tokens_removed = Counter(
            "context_guard_tokens_removed", "Prompt tokens removed by trimming.", ["model"], registry=r
        )
        self.rejections = Counter(
            "context_guard_rejections", "Requests rejected as too long to fit.", ["model"], registry=r
        )
        self.upstream_errors = Counter(
            "context_guard_upstream_errors",
            "Upstream failures, by upstream and kind.",
            ["upstream", "kind"],
            registry=r,
        )
        self.corrections = Counter(
            "context_guard_self_corrections",
            "Upstream context-length errors, by what the guard did (retried, remembered, implausible, ...).",
            ["model", "result"],
            registry=r,
        )
        self.corrected_window = Gauge(
            "context_guard_corrected_window_tokens",
            "The window a remembered self-correction gives a model on an upstream.",
            ["upstream", "model"],
            registry=r,
        )
        if state is not None:
            r.register(_StateCollector(lambda: self.state_status() if self.state_status else None))
        self.duration = Histogram(
            "context_guard_duration_seconds",
            "Time spent, by phase (count, trim, upstream, total).",
            ["phase"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        # `labels()` takes a lock and checks its values on every call: each series is looked up
        # once and kept (every label set is bounded, see above).
        self._phases = {phase: self.duration.labels(phase) for phase in ("total", "upstream", "count", "trim")}
        self._requests: dict[tuple[str, str, str], Counter] = {}

    def observe(self, record: RequestRecord) -> None:
        """Everything one finished request adds, read from its record."""
        status = _STATUS_CLASSES.get(record.status // 100, "other") if record.status != 499 else "499"
        labels = (record.kind, record.outcome or "unknown", status)
        requests = self._requests.get(labels)
        if requests is None:
            requests = self._requests[labels] = self.requests.labels(*labels)
        requests.inc()
        phases = self._phases
        phases["total"].observe(record.total_ms / 1000)
        if record.upstream is not None and record.upstream_status is not None:
            phases["upstream"].observe(record.upstream_ms / 1000)
        plan = record.plan
        if plan is None:
            return
        phases["count"].observe(plan.count_seconds)
        phases["trim"].observe(plan.trim_seconds)
        model = self.model_label(record.served_model or record.model)
        result = plan.result
        if record.outcome == "trimmed":
            self.trims.labels(model).inc()
            self.tokens_removed.labels(model).inc(result.tokens_before - result.tokens_after)
        elif record.outcome == "rejected":
            self.rejections.labels(model).inc()
        if record.learned_correction is not None:
            self.corrections.labels(model, "remembered" if record.status < 400 else "retried").inc()
        if record.correction_note:
            self.corrections.labels(model, record.correction_note).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _StateCollector:
    """The learned-state store's own counters, read when /metrics is scraped."""

    def __init__(self, status: Callable[[], StateStatus | None]) -> None:
        self.status = status

    def collect(self) -> Iterator[Metric]:
        status = self.status()
        if status is None:
            return
        shared = GaugeMetricFamily(
            "context_guard_state_shared", "1 while learned state is read from and written to Redis.", labels=["backend"]
        )
        shared.add_metric([status.backend], 1.0 if status.shared else 0.0)
        yield shared
        yield CounterMetricFamily(
            "context_guard_state_fallbacks",
            "Learned-state reads and writes that used local state.",
            value=status.fallbacks,
        )
        yield CounterMetricFamily(
            "context_guard_state_errors", "Redis calls that failed or missed their deadline.", value=status.errors
        )
