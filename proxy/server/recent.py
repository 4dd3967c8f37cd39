"""The recent decisions an operator can look at: a bounded ring of the last `page.size` requests.

Each entry is a `Decision` taken from the request's `RequestRecord` when the request ends: counts,
names, ids, what was removed and by which strategy, never any message content. Beside it: the latest
learned or applied correction per upstream and model (bounded: model names come from clients), and
calibration ratios when something feeds them. `proxy.server.page` renders it as HTML and JSON.

The buffer belongs to the app, not to the gateway, so a SIGHUP reload keeps it; with several
workers, each worker keeps its own.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from aiohttp import web

from proxy.server.record import RequestRecord, folded_removals, summary

MAX_RUNS = 12  # removal runs kept per decision; the rest are summed into one entry
MAX_CORRECTION_PAIRS = 256  # model names come from clients: the table of corrections is bounded too
KNOWN_OUTCOMES = ("unchanged", "trimmed", "rejected", "forwarded_over_budget", "forwarded", "refused", "failed")


@dataclass(frozen=True, slots=True)
class Decision:
    """One request as the page shows it: what was decided, never what was said."""

    at: float
    request_id: str
    kind: str
    outcome: str
    status: int
    model: str | None = None
    served_model: str | None = None
    upstream: str | None = None
    mode: str | None = None
    tokens_before: int | None = None
    tokens_after: int | None = None
    budget: int | None = None
    removed_count: int = 0
    removed_tokens: int = 0
    by_strategy: dict[str, dict[str, int]] = field(default_factory=dict)
    removed: tuple[dict[str, Any], ...] = ()
    notes: tuple[str, ...] = ()
    corrected_window: int | None = None  # the window an upstream's count taught, learned or applied here
    total_ms: float = 0.0

    @classmethod
    def from_record(cls, record: RequestRecord) -> Decision:
        head = summary(record)
        runs = folded_removals(record.removals)  # no previews: the page never shows content
        if len(runs) > MAX_RUNS:
            rest = runs[MAX_RUNS - 1 :]
            tokens = sum(int(run.get("tokens", 0)) for run in rest)
            runs = [*runs[: MAX_RUNS - 1], {"what": f"{len(rest)} more runs", "tokens": tokens}]
        correction = record.learned_correction or record.applied_correction
        return cls(
            at=record.at,
            request_id=record.request_id,
            kind=record.kind,
            outcome=head["outcome"] or "unknown",
            status=head["status"],
            model=head.get("model"),
            served_model=head.get("served_model"),
            upstream=record.upstream,
            mode=record.mode,
            tokens_before=head.get("tokens_before"),
            tokens_after=head.get("tokens_after"),
            budget=head.get("budget"),
            removed_count=head.get("removed_count", 0),
            removed_tokens=head.get("removed_tokens", 0),
            by_strategy=head.get("by_strategy", {}),
            removed=tuple(runs),
            notes=tuple(record.notes),
            corrected_window=correction.window if correction is not None else None,
            total_ms=record.total_ms,
        )

    def matches(self, query: PageQuery) -> bool:
        if query.request_id and query.request_id not in self.request_id:
            return False
        if query.outcome and query.outcome != self.outcome:
            return False
        names = (self.model or "", self.served_model or "")
        return not query.model or any(query.model.lower() in name.lower() for name in names)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["removed"], out["notes"] = list(self.removed), list(self.notes)
        out["time"] = iso_time(self.at)
        return out


@dataclass(frozen=True, slots=True)
class PageQuery:
    """The filter, from the query string: substrings of request id and model, an exact outcome."""

    request_id: str = ""
    model: str = ""
    outcome: str = ""

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> PageQuery:
        return cls(*(query.get(name, "").strip()[:200] for name in ("request_id", "model", "outcome")))

    @property
    def active(self) -> bool:
        return bool(self.request_id or self.model or self.outcome)


class RecentDecisions:
    """The last `size` decisions (oldest dropped first), the latest correction per upstream and
    model, and calibration ratios by model (empty until something feeds `calibration`)."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"page.size: must be at least 1, not {size}")
        self.decisions: deque[Decision] = deque(maxlen=size)
        self.corrections: OrderedDict[tuple[str, str], dict[str, Any]] = OrderedDict()
        self.calibration: dict[str, float] = {}

    @property
    def size(self) -> int:
        return self.decisions.maxlen or 0

    def add(self, record: RequestRecord) -> None:
        """Keep what `record` decided. Local requests that succeeded (the page itself, metrics,
        probes) are not decisions and are not kept."""
        if record.kind == "local" and record.status < 400:
            return
        self.decisions.append(Decision.from_record(record))
        for correction, source in ((record.applied_correction, "applied"), (record.learned_correction, "learned")):
            if correction is not None and record.upstream is not None:
                pair = (record.upstream, record.served_model or record.model or "")
                self.corrections.pop(pair, None)
                self.corrections[pair] = {"source": source, "at": record.at, **correction.to_dict()}
                while len(self.corrections) > MAX_CORRECTION_PAIRS:
                    self.corrections.popitem(last=False)

    def rows(self, query: PageQuery) -> list[Decision]:
        """Matching decisions, newest first."""
        return [d for d in reversed(self.decisions) if d.matches(query)]

    def to_dict(self, query: PageQuery) -> dict[str, Any]:
        return {
            "size": self.size,
            "filter": asdict(query),
            "rows": [d.to_dict() for d in self.rows(query)],
            "corrections": [
                {"upstream": upstream, "model": model, **values}
                for (upstream, model), values in reversed(self.corrections.items())
            ],
            "calibration": dict(self.calibration),
        }


RECENT = web.AppKey("recent_decisions", RecentDecisions)


def install_page(app: web.Application, size: int) -> RecentDecisions:
    """The buffer, under `RECENT`; the app's dispatcher serves `PAGE_HANDLERS` at their paths."""
    recent = app[RECENT] = RecentDecisions(size)
    return recent


def iso_time(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
