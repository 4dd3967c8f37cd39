"""One typed record per request, and the renderers that all read from it.

`RequestRecord` is what the operator reads of a request. The request's flow
(`proxy.server.request.flow.Flow`) is one: the `records` middleware opens it for every request that
reaches the app and closes it in one place, whatever happened (a 401, a path refused, a client
that went away, a trimmed stream), so every request yields exactly one log line and one metrics
update. The steps write what they work out on it, and its notes go by one channel
(`RequestRecord.note`). The log line (`log_event`), the `x-context-guard-*` headers
(`report_headers`), the metrics (`Metrics.observe`) and the recent-decisions page are each
rendered from it, in one place each.

A log line starts with the summary an operator scans for: outcome, model, tokens before/after
against the budget, how many messages and tokens went, by which strategy. What was removed
follows, folded into runs ("messages 1-138: 138 dropped, 14,021 tokens, drop_oldest_turns") and
bounded in size. Content is never logged; `log.content_preview_chars` opts in to previews.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.core.learning.corrections import Correction
from proxy.core.plan import Plan
from proxy.core.trimming.budget import Removal

REPORT_PREFIX = "x-context-guard-"
# The outcome of a request the guard answers itself (Anthropic's count_tokens, Gemini's countTokens).
ANSWERED_LOCALLY = "answered_locally"


@dataclass(slots=True)
class RequestRecord:
    request_id: str
    method: str
    path: str
    started: float = field(default_factory=time.perf_counter)
    at: float = field(default_factory=time.time)
    kind: str = "local"  # an API name (chat, responses, completions, messages), passthrough or local
    model: str | None = None  # as the client named it
    served_model: str | None = None  # as the route sends it upstream (after a rename)
    upstream: str | None = None
    mode: str | None = None
    status: int = 0
    outcome: str | None = None
    error: str | None = None  # the error code the client got, if any
    plan: Plan | None = None
    window_source: str | None = None
    applied_correction: Correction | None = None
    learned_correction: Correction | None = None
    correction_note: str | None = None  # why an overflow error taught nothing ("implausible", ...)
    attempts: int = 0
    upstream_status: int | None = None
    upstream_ms: float = 0.0
    stream: bool = False
    stream_broken: str | None = None
    guard_outcome: str | None = None  # what the guard did (trimmed, unchanged) when what followed failed
    map_correction: dict[str, Any] | None = None  # the model map's entry as corrected from the provider's docs
    client_disconnected: bool = False
    delivered: bool = False  # the client had the whole answer: leaving after it is no failure
    count_source: str | None = None  # backend (the server's tokenizer), model, calibrated or estimate
    calibration: float | None = None  # the factor a calibrated estimate was scaled by
    provider_prompt_tokens: int | None = None  # what the upstream's usage said it counted
    provider_cached_tokens: int | None = None  # of which it read from its cache
    provider_output_tokens: int | None = None  # what it said the answer took
    held_tokens: int | None = None  # what the context the provider holds for the request weighs
    held_source: str | None = None  # ledger, provider, partial or unknown (None: it names none)
    upstream_overflow: dict[str, Any] | None = None  # an overflow error the upstream answered, as read
    notes: list[str] = field(default_factory=list)  # e.g. fallback_window, estimate, server_state
    unread_fields: tuple[str, ...] = ()  # top-level fields the guard could not count (names only)
    unseen_parts: tuple[str, ...] = ()  # where the parts are whose content the guard cannot see
    override: str | None = None  # the pattern of the operator's override that applied to the model
    previews: dict[int, str] = field(default_factory=dict)  # opt-in removal previews by message index
    removed_tools: dict[int, tuple[str, ...]] = field(default_factory=dict)  # tools removed messages called or answered
    total_ms: float = 0.0

    def finish(self, status: int) -> None:
        self.status = status
        self.total_ms = round((time.perf_counter() - self.started) * 1000, 2)
        if status == 499:
            self.client_disconnected, self.error = True, self.error or "client_disconnected"
            self.outcome = "client_disconnected"
        elif status >= 500 and self.error is not None:  # the guard's own failure (502, 503, 504, 500)
            self.outcome = "failed"
        elif self.stream_broken is not None and status < 400:
            # The client had the status line and part of the answer, then an error event: the
            # answer failed as a 502 would have, whatever the status line said.
            self.guard_outcome, self.outcome = self.outcome, "stream_broken"
            self.status, self.error = 502, self.error or "upstream_stream_broken"
        if self.outcome is None:
            self.outcome = _outcome_for_status(status, self.kind)

    @property
    def removals(self) -> tuple[Removal, ...]:
        """What was cut from the request sent on; nothing for a request answered here (a count
        endpoint), which is counted, never cut nor forwarded."""
        if self.plan is None or self.outcome == ANSWERED_LOCALLY:
            return ()
        return self.plan.result.removals

    def note(self, name: str, present: bool = True) -> None:
        """Say `name` on the request's log line and its row on the page, once (or no longer say
        it): the one channel every step's notes and reasons reach the operator by."""
        if present and name not in self.notes:
            self.notes.append(name)
        elif not present and name in self.notes:
            self.notes.remove(name)

    @property
    def is_warning(self) -> bool:
        """Worth an operator's attention: a rejection, a server-side failure, a request sent on
        over budget, a model counted against a guessed window or with an estimate."""
        return (
            self.status >= 500
            or self.outcome in ("rejected", "forwarded_over_budget", "dry_run_rejected")
            or self.correction_note == "implausible"
            or "fallback_window" in self.notes
        )


def _outcome_for_status(status: int, kind: str) -> str:
    if status == 499:
        return "client_disconnected"
    if status >= 400:
        return "refused" if status < 500 else "failed"
    return "forwarded" if kind != "local" else "answered"


# What kind of count the guard's is, on every guarded answer and on a count it answers itself:
# `exact`; `upper-bound` (a bound tokenizer, a ciphertext's size); `estimate` (parts estimated, or
# held context sized from the provider's reports); `incomplete` (some of what the provider reads
# is not counted at all: held context the guard could not size, hosted tools' additions).
COUNT_HEADER = f"{REPORT_PREFIX}count"
HELD_HEADER, HELD_TOKENS_HEADER = f"{REPORT_PREFIX}held", f"{REPORT_PREFIX}held-tokens"


def count_headers(kind: str, held_source: str | None, held_tokens: int) -> dict[str, str]:
    """The headers saying what kind of count the guard's is, and what of it the provider holds."""
    headers = {COUNT_HEADER: kind}
    if held_source is not None:
        headers[HELD_HEADER] = held_source
        headers[HELD_TOKENS_HEADER] = str(held_tokens)
    return headers


_BEFORE, _AFTER, _BUDGET, _REMOVED, _MODE = (
    f"{REPORT_PREFIX}{name}" for name in ("tokens-before", "tokens-after", "budget", "removed", "mode")
)
_CLEARED, _CLEARED_TOKENS, _PREFIX, _DROPPED, _TRUNCATED, OUTCOME_HEADER = (
    f"{REPORT_PREFIX}{name}"
    for name in ("cleared", "cleared-tokens", "prefix-tokens", "dropped", "truncated", "outcome")
)


def report_headers(plan: Plan | None, mode: str | None) -> dict[str, str]:
    """The `x-context-guard-*` headers a guarded response carries: what `plan` did, in `mode`."""
    if plan is None:
        return {_MODE: mode} if mode else {}
    result = plan.result
    headers = {
        _BEFORE: str(result.tokens_before),
        _AFTER: str(result.tokens_after),
        _BUDGET: str(result.budget.input_budget),
        _REMOVED: str(len(result.removals)),
        _MODE: mode or "enforce",
        # As the log says it: a mode that only reports (observe) changed nothing it says it would.
        OUTCOME_HEADER: result.outcome if mode in (None, "enforce") else f"dry_run_{result.outcome}",
    }
    if result.changed:  # what was cleared in place, and the start the provider's cache still has
        count, tokens = cleared(result.removals)
        headers[_CLEARED], headers[_CLEARED_TOKENS] = str(count), str(tokens)
        # The same kinds as the log's `removed` runs: removed whole, and shortened in place.
        headers[_DROPPED] = str(sum(1 for r in result.removals if r.kind == "dropped"))
        headers[_TRUNCATED] = str(sum(1 for r in result.removals if r.kind == "truncated"))
        headers[_PREFIX] = str(result.prefix_tokens)
    return headers


def cleared(removals: Sequence[Removal]) -> tuple[int, int]:
    """How many tool results were cleared (`proxy.core.trimming.clearing`), and the tokens that freed."""
    tokens = [r.tokens for r in removals if r.kind == "cleared"]
    return len(tokens), sum(tokens)


def summary(record: RequestRecord) -> dict[str, Any]:
    """The fields an operator reads first, in reading order."""
    out: dict[str, Any] = {}
    _summarise(record, out)
    return out


def _summarise(record: RequestRecord, out: dict[str, Any]) -> None:
    out["outcome"], out["status"] = record.outcome, record.status
    if record.model is not None:
        out["model"] = record.model
        served = served_model_shown(record)
        if served is not None:
            out["served_model"] = served
        if record.override is not None:
            out["override"] = record.override
    if record.plan is not None and record.outcome == ANSWERED_LOCALLY:
        out["tokens_counted"] = record.plan.count.total
    elif record.plan is not None:
        result = record.plan.result
        removals = result.removals
        out["tokens_before"], out["tokens_after"] = result.tokens_before, result.tokens_after
        out["budget"], out["removed_count"] = result.budget.input_budget, len(removals)
        out["removed_tokens"] = sum(r.tokens for r in removals) if removals else 0
        if removals:
            out["by_strategy"] = by_strategy(removals)
        if result.changed:
            count, tokens = cleared(removals)
            if count:
                out["cleared"] = {"count": count, "tokens": tokens}
            out["prefix_tokens"] = result.prefix_tokens


def served_model_shown(record: RequestRecord) -> str | None:
    """The model a route renamed the request to, when it names one the client did not."""
    model, served = record.model, record.served_model
    return served if model is not None and served and served != model else None


def by_strategy(removals: Sequence[Removal]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for removal in removals:
        entry = out.setdefault(removal.strategy, {"count": 0, "tokens": 0})
        entry["count"] += 1
        entry["tokens"] += removal.tokens
    return out


def folded_removals(
    removals: Sequence[Removal], previews: Mapping[int, str] | None = None, *, hashes: bool = True
) -> list[dict[str, Any]]:
    """Removals as runs: consecutive messages removed the same way by the same strategy are one
    entry with a range; a run of one keeps its role and (with `hashes`) its content hash."""
    runs: list[list[Removal]] = []
    for removal in removals:
        last = runs[-1][-1] if runs else None
        if (
            not previews  # with previews on, each removal keeps its own entry and preview
            and last is not None
            and removal.index is not None
            and last.index is not None
            and removal.index == last.index + 1
            and (removal.kind, removal.strategy) == (last.kind, last.strategy)
        ):
            runs[-1].append(removal)
        else:
            runs.append([removal])
    out = []
    for run in runs:
        first, last = run[0], run[-1]
        entry: dict[str, Any]
        if len(run) == 1:
            where = "request" if first.index is None else f"message {first.index}"
            entry = {"what": where, "role": first.role, "kind": first.kind, "tokens": first.tokens}
            entry["strategy"] = first.strategy
            if hashes:
                entry["hash"] = first.hash
            if previews and first.index is not None and first.index in previews:
                entry["preview"] = previews[first.index]
        else:
            entry = {"what": f"messages {first.index}-{last.index}", "count": len(run), "kind": first.kind}
            entry.update(tokens=sum(r.tokens for r in run), strategy=first.strategy)
        out.append(entry)
    return out


def log_event(record: RequestRecord, max_line_bytes: int) -> dict[str, Any]:
    """The one log event of a request: the summary first, then the details (those with a value),
    then what was removed. Written field by field: it is built for every request."""
    event: dict[str, Any] = {"request_id": record.request_id}
    _summarise(record, event)
    event["kind"], event["method"], event["path"] = record.kind, record.method, clipped(record.path)
    value: Any
    for key, value in (
        ("upstream", record.upstream),
        ("mode", record.mode),
        ("error", record.error),
        ("upstream_status", record.upstream_status),
    ):
        if value is not None:
            event[key] = value
    plan = record.plan
    if plan is not None:
        result = plan.result
        budget = result.budget
        event["context_window"] = budget.context_window
        if record.window_source is not None:
            event["window_source"] = record.window_source
        event["output_reserve"] = budget.output_reserve
        if plan.count.tokenizer is not None:
            event["tokenizer"] = plan.count.tokenizer
        event["exact"] = plan.count.exact
        event["count_ms"], event["trim_ms"] = round(plan.count_seconds * 1000, 2), round(plan.trim_seconds * 1000, 2)
        if result.cut is not None:
            event["cut"] = result.cut.to_dict()
        if result.summary is not None:
            event["summary"] = result.summary.to_dict()
        if result.note_tokens:
            event["note_tokens"] = result.note_tokens
    for key, value in (
        ("count_source", record.count_source),
        ("calibration", round(record.calibration, 4) if record.calibration is not None else None),
        ("provider_prompt_tokens", record.provider_prompt_tokens),
        ("provider_cached_tokens", record.provider_cached_tokens),
        ("provider_output_tokens", record.provider_output_tokens),
        ("held_tokens", record.held_tokens),
        ("held_source", record.held_source),
        ("upstream_overflow", record.upstream_overflow),
        ("applied_correction", _dict(record.applied_correction)),
        ("self_correction", _dict(record.learned_correction)),
        ("self_correction_ignored", record.correction_note),
        ("attempts", record.attempts if record.attempts > 1 else None),
        ("stream", True if record.stream else None),
        ("stream_broken", record.stream_broken),
        ("guard_outcome", record.guard_outcome),
        ("map_correction", record.map_correction),
        ("client_disconnected", True if record.client_disconnected else None),
        ("notes", list(record.notes) or None),
        ("unread_fields", clipped_names(record.unread_fields) or None),
        ("unseen_parts", list(record.unseen_parts) or None),
    ):
        if value is not None:
            event[key] = value
    if record.upstream is not None:
        event["upstream_ms"] = round(record.upstream_ms, 2)
    event["total_ms"] = record.total_ms
    if record.removals:
        # The rest of the line as it will be written, plus what the logger adds (event, level, timestamp).
        rest = len(orjson.dumps(event, default=str)) + LOGGER_FIELDS_BYTES
        event["removed"] = _bounded(folded_removals(record.removals, record.previews), max_line_bytes - rest)
    return event


# What a client wrote reaches the line bounded: a path, and names (of fields it sent).
SHOWN_CHARS = 256
SHOWN_NAMES = 16


def clipped(text: str, limit: int = SHOWN_CHARS) -> str:
    """`text`, or its first `limit` characters and how many more there were."""
    return text if len(text) <= limit else f"{text[:limit]}...({len(text) - limit:,} more characters)"


def clipped_names(names: Sequence[str]) -> list[str]:
    """At most `SHOWN_NAMES` names, each clipped, and how many more there were."""
    shown = [clipped(name, 64) for name in names[:SHOWN_NAMES]]
    if len(names) > SHOWN_NAMES:
        shown.append(f"...({len(names) - SHOWN_NAMES:,} more)")
    return shown


LOGGER_FIELDS_BYTES = 160  # `"removed":[...]`, `"event":"request"`, the level, the timestamp, a worker number
FOLDED_NOTE_BYTES = 60  # {"what":"999 more runs","tokens":123456789}


def _dict(value: Any) -> dict[str, Any] | None:
    """A record's typed part (a cut, a summary report, a correction) as the log writes it."""
    return value.to_dict() if value is not None else None


def _bounded(entries: list[dict[str, Any]], max_bytes: int) -> list[dict[str, Any]]:
    """As many entries as fit in `max_bytes` of JSON with room for a note of the rest, then that note."""
    budget, used, kept = max_bytes - FOLDED_NOTE_BYTES, 0, []
    for i, entry in enumerate(entries):
        size = len(orjson.dumps(entry, default=str)) + 1
        if used + size > budget:
            rest = entries[i:]
            kept.append({"what": f"{len(rest)} more runs", "tokens": sum(int(e.get("tokens", 0)) for e in rest)})
            break
        kept.append(entry)
        used += size
    return kept
