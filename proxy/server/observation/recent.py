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
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from aiohttp import web

from proxy.core.trimming.budget import Removal
from proxy.server.observation.record import (
    ANSWERED_LOCALLY,
    RequestRecord,
    by_strategy,
    folded_removals,
    served_model_shown,
)

MAX_RUNS = 12  # removal runs kept per decision; the rest are summed into one entry
EAGER_REMOVALS = 64  # a decision with more removals folds them when taken, not when read
MAX_CORRECTION_PAIRS = 256  # model names come from clients: the table of corrections is bounded too
# Names come from clients: what a row keeps of each is bounded, so `page.size` rows are a bounded
# page (at most about 2 KB of names per row) whatever the requests said.
MAX_NAME_CHARS = 256
MAX_NOTES = 8
MAX_NOTE_CHARS = 64  # notes are the guard's own words; bounded all the same
KNOWN_OUTCOMES = (
    "unchanged", "trimmed", "rejected", "forwarded_over_budget", "forwarded", ANSWERED_LOCALLY, "refused", "failed",
)  # fmt: skip
MAX_TOOL_NAMES = 8  # tool names a removed run lists; the rest are counted


class Decision:
    """One request as the page shows it: what was decided, never what was said.

    Taken for every request, read only when someone opens the page: it keeps the record's few
    values and its removals as they are, and works out the totals and the folded runs when they
    are first read (a request that removed many keeps its runs folded at once instead, so the
    ring never holds thousands of removals per row). Not to be changed once made."""

    __slots__ = (
        "_folded",
        "_removals",
        "_tools",
        "at",
        "budget",
        "corrected_window",
        "error",
        "kind",
        "mode",
        "model",
        "notes",
        "outcome",
        "provider_prompt_tokens",
        "request_id",
        "served_model",
        "status",
        "stream",
        "tokens_after",
        "tokens_before",
        "tokens_counted",
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
        self.total_ms, self.stream, self.error = record.total_ms, record.stream, _bounded(record.error)
        self.provider_prompt_tokens = record.provider_prompt_tokens  # the upstream's usage, beside tokens_after
        plan, self._tools = record.plan, record.removed_tools
        self.tokens_counted: int | None = None
        if plan is None or record.outcome == ANSWERED_LOCALLY:  # answered here: counted, nothing cut
            self.tokens_before = self.tokens_after = self.budget = None
            self.tokens_counted = plan.count.total if plan is not None else None
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
    def from_dict(cls, data: Mapping[str, Any], worker: int) -> Decision:
        """A decision another worker kept, from its `to_dict()` (`proxy.server.observation.peers`)."""
        made = cls.__new__(cls)
        for name in DECISION_FIELDS:
            if name not in _FOLDED_FIELDS:
                setattr(made, name, data.get(name))
        made.notes, made.worker, made._removals, made._tools = tuple(data.get("notes") or ()), worker, (), {}
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
            runs = held_runs(removals, self._tools)
            if len(runs) > MAX_RUNS:
                rest = runs[MAX_RUNS - 1 :]
                tokens = sum(int(run.get("tokens", 0)) for run in rest)
                runs = [*runs[: MAX_RUNS - 1], {"what": f"{len(rest)} more runs", "tokens": tokens}]
            strategies = by_strategy(removals) if removals else {}
            self._folded = Folded(len(removals), sum(r.tokens for r in removals), strategies, tuple(runs))
            self._removals, self._tools = (), {}
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


def held_runs(removals: Sequence[Removal], tools: Mapping[int, tuple[str, ...]]) -> list[dict[str, Any]]:
    """The removals as the page shows them: removals next to each other in the trim's order, of
    one kind by one strategy, are one run (the results one clearing replaced, every other message,
    are one run here where the log lists each), saying what it held: how many messages of each
    role, and the tools they called or answered, with how often (names only, never content; no
    hashes either: a hash is content to whoever can guess it)."""
    runs: list[list[Removal]] = []
    for removal in removals:
        last = runs[-1][-1] if runs else None
        if (
            last is not None
            and removal.index is not None
            and last.index is not None
            and removal.index > last.index
            and (removal.kind, removal.strategy) == (last.kind, last.strategy)
        ):
            runs[-1].append(removal)
        else:
            runs.append([removal])
    return [_held(run, tools) for run in runs]


def _held(run: list[Removal], tools: Mapping[int, tuple[str, ...]]) -> dict[str, Any]:
    first, last = run[0], run[-1]
    if len(run) == 1:
        (entry,) = folded_removals(run, hashes=False)
    else:
        spread = "" if last.index - first.index + 1 == len(run) else f", {len(run)} of them"  # type: ignore[operator]
        entry = {"what": f"messages {first.index}-{last.index}{spread}", "count": len(run), "kind": first.kind}
        entry.update(tokens=sum(r.tokens for r in run), strategy=first.strategy)
    roles: dict[str, int] = {}
    named: dict[str, int] = {}
    for removal in run:
        if removal.role:
            roles[removal.role] = roles.get(removal.role, 0) + 1
        for tool in tools.get(removal.index, ()) if removal.index is not None else ():
            named[tool] = named.get(tool, 0) + 1
    if roles:
        entry["roles"] = roles
    if named:
        shown = list(named.items())[:MAX_TOOL_NAMES]
        entry["tools"] = {_cut(tool, 64): count for tool, count in shown}
        if len(named) > MAX_TOOL_NAMES:
            entry["tools_not_shown"] = len(named) - MAX_TOOL_NAMES
    return entry


def removed_tool_names(messages: Sequence[Any], removals: Sequence[Removal]) -> dict[int, tuple[str, ...]]:
    """By the index of each removed message (in the chat view): the tools it called (an assistant's
    `tool_calls`) or answered (a tool result, by its call's id or its own `name`). Names only."""
    wanted = {r.index for r in removals if r.index is not None}
    if not wanted:
        return {}
    called: dict[str, str] = {}  # call id -> tool name, over the whole conversation
    calls_of: dict[int, tuple[str, ...]] = {}
    for index, message in enumerate(messages):
        calls = message.get("tool_calls") if isinstance(message, dict) else None
        if not isinstance(calls, list):
            continue
        names = []
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            name = function.get("name") if isinstance(function, dict) else None
            if isinstance(name, str):
                names.append(name)
                if isinstance(call.get("id"), str):
                    called[call["id"]] = name
        calls_of[index] = tuple(names)
    out: dict[int, tuple[str, ...]] = {}
    for index in sorted(wanted):
        message = messages[index] if 0 <= index < len(messages) else None
        if not isinstance(message, dict):
            continue
        name = called.get(str(message.get("tool_call_id"))) or message.get("name")
        if index in calls_of:
            out[index] = calls_of[index]
        elif isinstance(name, str) and message.get("role") in ("tool", "function"):
            out[index] = (name,)
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
    "at", "request_id", "kind", "outcome", "status", "error", "model", "served_model", "upstream", "mode", "stream",
    "tokens_counted", "tokens_before", "tokens_after", "budget", "removed_count", "removed_tokens", "by_strategy",
    "removed", "notes", "corrected_window", "provider_prompt_tokens", "total_ms", "worker",
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
