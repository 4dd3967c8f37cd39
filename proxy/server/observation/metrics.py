"""Prometheus metrics for one app, in a registry of its own (so tests can run many apps).

Every series is bounded: the `model` label is a configured or known model name (the model map's
key it resolved to), or `other`, never the raw name a client sent; upstreams come from the
config. `_created` series are off, and the standard `process_*` metrics are on.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from proxy.server.observation.record import RequestRecord
from proxy.server.process.loop_lag import LoopLag
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
        # Written for every request: kept by the event loop itself, rendered when scraped (below).
        self.requests = LoopCounter(
            "context_guard_requests",
            "Requests handled, by kind (API, passthrough, local), outcome and status.",
            ("kind", "outcome", "status"),
        )
        r.register(self.requests)
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
        # The provider's count beside the guard's, over the requests whose answer reported usage:
        # their ratio is how close the guard's count runs to the provider's.
        # Written on most answers, so kept by the loop itself like `requests` (see `LoopCounter`).
        self.provider_prompt_tokens = LoopCounter(
            "context_guard_provider_prompt_tokens",
            "Prompt tokens the upstreams' usage reported, for requests whose answers carried it.",
            ["model"],
        )
        self.counted_prompt_tokens = LoopCounter(
            "context_guard_counted_prompt_tokens",
            "Prompt tokens the guard counted (as sent) for the same requests.",
            ["model"],
        )
        r.register(self.provider_prompt_tokens)
        r.register(self.counted_prompt_tokens)
        self.upstream_overflows = Counter(
            "context_guard_upstream_overflows",
            "Upstream context-length errors, by whether the error said the provider's count.",
            ["model", "numbers"],
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
        self.duration = PhaseDurations(
            "context_guard_duration_seconds",
            "Time spent, by phase (count, trim, upstream, total).",
            ("total", "upstream", "count", "trim"),
            _LATENCY_BUCKETS,
        )
        r.register(self.duration)
        self.loop_lag = LoopLag()  # fed by the serving process's `LoopWatch` (proxy.server.process.lifecycle)
        r.register(self.loop_lag)

    def observe(self, record: RequestRecord) -> None:
        """Everything one finished request adds, read from its record."""
        status = _STATUS_CLASSES.get(record.status // 100, "other") if record.status != 499 else "499"
        self.requests.inc((record.kind, record.outcome or "unknown", status))
        observe = self.duration.observe
        observe("total", record.total_ms / 1000)
        if record.upstream is not None and record.upstream_status is not None:
            observe("upstream", record.upstream_ms / 1000)
        plan = record.plan
        if plan is None:
            return
        observe("count", plan.count_seconds)
        observe("trim", plan.trim_seconds)
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
        if record.provider_prompt_tokens is not None:
            self.provider_prompt_tokens.inc((model,), record.provider_prompt_tokens)
            self.counted_prompt_tokens.inc((model,), result.tokens_after)
        if record.upstream_overflow is not None:
            numbers = "yes" if record.upstream_overflow.get("prompt_tokens") is not None else "no"
            self.upstream_overflows.labels(model, numbers).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class LoopCounter:
    """A counter by label values, as `prometheus_client.Counter` renders it (`_total`), counted
    without its per-value lock and label lookup: only the event loop writes it, once per request.
    Label values are bounded by the caller (see the module's docstring)."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str]) -> None:
        self.name, self.documentation, self.labels = name, documentation, list(labels)
        self.counts: dict[tuple[str, ...], int] = {}

    def inc(self, values: tuple[str, ...], amount: int = 1) -> None:
        counts = self.counts
        counts[values] = counts.get(values, 0) + amount

    def value(self, *values: str) -> int:
        return self.counts.get(values, 0)

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        for values, count in list(self.counts.items()):
            family.add_metric(list(values), float(count))
        yield family


class PhaseDurations:
    """A histogram by phase, as `prometheus_client.Histogram` renders it (every phase shown from
    the start, buckets cumulative, `_count` and `_sum`), observed with one `bisect` and two list
    updates instead of a lock per bucket and per sum: only the event loop writes it."""

    def __init__(self, name: str, documentation: str, phases: Sequence[str], buckets: Sequence[float]) -> None:
        self.name, self.documentation = name, documentation
        self.bounds = (*buckets, float("inf"))
        # the `le` labels as prometheus_client writes them ("0.001", ..., "+Inf")
        self.labels = [floatToGoString(bound) for bound in self.bounds]  # type: ignore[no-untyped-call]  # untyped library
        self.buckets = {phase: [0] * len(self.bounds) for phase in phases}
        self.sums = dict.fromkeys(phases, 0.0)

    def observe(self, phase: str, seconds: float) -> None:
        self.buckets[phase][bisect_left(self.bounds, seconds)] += 1
        self.sums[phase] += seconds

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=["phase"])
        for phase, counts in self.buckets.items():
            cumulative, total = [], 0
            for label, count in zip(self.labels, counts, strict=True):
                total += count
                cumulative.append((label, float(total)))
            family.add_metric([phase], cumulative, self.sums[phase])
        yield family


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
