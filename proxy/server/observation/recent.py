"""The recent decisions an operator can look at: a bounded ring of the last `page.size` requests.

Each entry is a `Decision` taken from the request's `RequestRecord` when the request ends: counts,
names, ids, what was removed and by which strategy, never any message content. Beside it: the latest
learned or applied correction per upstream and model (bounded: model names come from clients), and
calibration ratios when something feeds them. `proxy.server.observation.page` renders it as HTML and JSON.

The buffer belongs to the app, not to the gateway, so a SIGHUP reload keeps it; with several
workers, each worker keeps its own, and the page gathers every worker's (`proxy.server.observation.peers`,
through `GATHER`) when it is opened.
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from aiohttp import web

from proxy.core.trimming.trim import Removal
from proxy.server.observation.record import RequestRecord, by_strategy, folded_removals, served_model_shown

MAX_RUNS = 12  # removal runs kept per decision; the rest are summed into one entry
EAGER_REMOVALS = 64  # a decision with more removals folds them when taken, not when read
MAX_CORRECTION_PAIRS = 256  # model names come from clients: the table of corrections is bounded too
# Names come from clients: what a row keeps of each is bounded, so `page.size` rows are a bounded
# page (at most about 2 KB of names per row) whatever the requests said.
MAX_NAME_CHARS = 256
MAX_NOTES = 8
MAX_NOTE_CHARS = 64  # notes are the guard's own words; bounded all the same
KNOWN_OUTCOMES = ("unchanged", "trimmed", "rejected", "forwarded_over_budget", "forwarded", "refused", "failed")


class Decision:
    """One request as the page shows it: what was decided, never what was said.

    Taken for every request, read only when someone opens the page: it keeps the record's few
    values and its removals as they are, and works out the totals and the folded runs when they
    are first read (a request that removed many keeps its runs folded at once instead, so the
    ring never holds thousands of removals per row). Not to be changed once made."""

    __slots__ = (
        "_folded",
        "_removals",
        "at",
        "budget",
        "corrected_window",
        "kind",
        "mode",
        "model",
        "notes",
        "outcome",
        "provider_prompt_tokens",
        "request_id",
        "served_model",
        "status",
        "tokens_after",
        "tokens_before",
        "total_ms",
        "upstream",
        "worker",
    )  # fmt: skip

    def __init__(self, record: RequestRecord) -> None:
        self.at, self.request_id, self.kind = record.at, _cut(record.request_id), record.kind
        self.outcome, self.status = _cut(record.outcome or "unknown"), record.status
        self.model, self.served_model = _bounded(record.model), _bounded(served_model_shown(record))
        self.upstream, self.mode = _bounded(record.upstream), record.mode
        self.notes = tuple(_cut(note, MAX_NOTE_CHARS) for note in record.notes[:MAX_NOTES])
        correction = record.learned_correction or record.applied_correction
        self.corrected_window = correction.window if correction is not None else None
        self.total_ms = record.total_ms
        self.provider_prompt_tokens = record.provider_prompt_tokens  # the upstream's usage, beside tokens_after
        plan = record.plan
        if plan is None:
            self.tokens_before = self.tokens_after = self.budget = None
            self._removals: tuple[Removal, ...] = ()
        else:
            result = plan.result
            self.tokens_before, self.tokens_after = result.tokens_before, result.tokens_after
            self.budget, self._removals = result.budget.input_budget, result.removals
        self._folded: Folded | None = None
        self.worker: int | None = None  # the serving process that decided it, once the page gathers several
        if len(self._removals) > EAGER_REMOVALS:
            self._fold()

    @classmethod
    def from_record(cls, record: RequestRecord) -> Decision:
        return cls(record)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], worker: int) -> Decision:
        """A decision another worker kept, from its `to_dict()` (`proxy.server.observation.peers`)."""
        made = cls.__new__(cls)
        for name in DECISION_FIELDS:
            if name not in _FOLDED_FIELDS:
                setattr(made, name, data.get(name))
        made.notes, made.worker, made._removals = tuple(data.get("notes") or ()), worker, ()
        runs = tuple(dict(run) for run in data.get("removed") or ())
        made._folded = Folded(data["removed_count"], data["removed_tokens"], dict(data["by_strategy"]), runs)
        return made

    def of_worker(self, worker: int) -> Decision:
        """This decision, said to be `worker`'s (a copy: the ring's own is never changed)."""
        twin = Decision.__new__(Decision)
        for name in Decision.__slots__:
            setattr(twin, name, getattr(self, name))
        twin.worker = worker
        return twin

    def _fold(self) -> Folded:
        if self._folded is None:
            removals = self._removals
            # No previews and no hashes: the page never shows content, and a content hash is
            # content to whoever can guess it (a short code, a name), while any client key reads it.
            runs = folded_removals(removals, hashes=False)
            if len(runs) > MAX_RUNS:
                rest = runs[MAX_RUNS - 1 :]
                tokens = sum(int(run.get("tokens", 0)) for run in rest)
                runs = [*runs[: MAX_RUNS - 1], {"what": f"{len(rest)} more runs", "tokens": tokens}]
            strategies = by_strategy(removals) if removals else {}
            self._folded = Folded(len(removals), sum(r.tokens for r in removals), strategies, tuple(runs))
            self._removals = ()
        return self._folded

    @property
    def removed_count(self) -> int:
        return self._fold().count

    @property
    def removed_tokens(self) -> int:
        return self._fold().tokens

    @property
    def by_strategy(self) -> dict[str, dict[str, int]]:
        return {name: dict(entry) for name, entry in self._fold().by_strategy.items()}

    @property
    def removed(self) -> tuple[dict[str, Any], ...]:
        return self._fold().runs

    def matches(self, query: PageQuery) -> bool:
        if query.request_id and query.request_id not in self.request_id:
            return False
        if query.outcome and query.outcome != self.outcome:
            return False
        names = (self.model or "", self.served_model or "")
        return not query.model or any(query.model.lower() in name.lower() for name in names)

    def to_dict(self) -> dict[str, Any]:
        folded = self._fold()
        out: dict[str, Any] = {name: getattr(self, name) for name in DECISION_FIELDS}
        out["removed"] = [dict(run) for run in folded.runs]
        out["notes"] = list(self.notes)
        out["time"] = iso_time(self.at)
        return out


@dataclass(frozen=True, slots=True)
class Folded:
    """What a decision removed, as the page shows it: totals, by strategy, and at most `MAX_RUNS` runs."""

    count: int
    tokens: int
    by_strategy: dict[str, dict[str, int]]
    runs: tuple[dict[str, Any], ...]


# The page's JSON fields, in their order (`removed`, `notes` and `time` are written by `to_dict`).
DECISION_FIELDS = (
    "at", "request_id", "kind", "outcome", "status", "model", "served_model", "upstream", "mode", "tokens_before",
    "tokens_after", "budget", "removed_count", "removed_tokens", "by_strategy", "removed", "notes",
    "corrected_window", "provider_prompt_tokens", "total_ms", "worker",
)  # fmt: skip
_FOLDED_FIELDS = frozenset({"removed_count", "removed_tokens", "by_strategy", "removed", "notes"})


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
        # Set on a view gathered from several workers: how many there are, which answered.
        self.workers: dict[str, Any] | None = None

    @property
    def size(self) -> int:
        return self.decisions.maxlen or 0

    def add(self, record: RequestRecord) -> None:
        """Keep what `record` decided. Local requests that succeeded (the page itself, metrics,
        probes) are not decisions and are not kept."""
        if record.kind == "local" and record.status < 400:
            return
        self.decisions.append(Decision(record))
        for correction, source in ((record.applied_correction, "applied"), (record.learned_correction, "learned")):
            if correction is not None and record.upstream is not None:
                pair = (_cut(record.upstream), _cut(record.served_model or record.model or ""))
                self.corrections.pop(pair, None)
                self.corrections[pair] = {"source": source, "at": record.at, **correction.to_dict()}
                while len(self.corrections) > MAX_CORRECTION_PAIRS:
                    self.corrections.popitem(last=False)

    def snapshot(self) -> RecentDecisions:
        """A copy to read in another thread while requests go on being added to this one."""
        copy = RecentDecisions(self.size)
        copy.decisions.extend(self.decisions)
        copy.corrections.update(self.corrections)
        copy.calibration.update(self.calibration)
        return copy

    def rows(self, query: PageQuery) -> list[Decision]:
        """Matching decisions, newest first."""
        return [d for d in reversed(self.decisions) if d.matches(query)]

    def to_dict(self, query: PageQuery, with_rows: bool = True) -> dict[str, Any]:
        return {
            "size": self.size,
            "filter": asdict(query),
            **({"rows": [d.to_dict() for d in self.rows(query)]} if with_rows else {}),
            "corrections": [
                {"upstream": upstream, "model": model, **values}
                for (upstream, model), values in reversed(self.corrections.items())
            ],
            "calibration": dict(self.calibration),
            **({"workers": self.workers} if self.workers is not None else {}),
        }


RECENT = web.AppKey("recent_decisions", RecentDecisions)
# With several workers: every worker's decisions, from a snapshot of this one's (proxy.server.observation.peers).
GATHER: web.AppKey[Callable[[RecentDecisions], Awaitable[RecentDecisions]]] = web.AppKey("gather_decisions")


def install_page(app: web.Application, size: int) -> RecentDecisions:
    """The buffer, under `RECENT`; the app's dispatcher serves the page at its paths
    (`proxy.server.edge.local_paths`)."""
    recent = app[RECENT] = RecentDecisions(size)
    return recent


def _cut(name: str, chars: int = MAX_NAME_CHARS) -> str:
    """`name` as a row keeps it: its first `chars` characters, and an ellipsis if cut."""
    return name if len(name) <= chars else name[:chars] + "…"


def _bounded(name: str | None) -> str | None:
    return None if name is None else _cut(name)


def iso_time(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
