"""The one entry point of the core: validate a body, count it, budget it, trim it; and the one type
every layer raises for a request body it refuses.

`plan_request()` is pure and synchronous, and safe to call from a worker thread (tiktoken
releases the GIL while it encodes; the count cache takes a lock), so that the server can move
the counting of a very large body off its event loop.

`trim()` fits a counted body to its budget as a `TrimPolicy` says: it runs the policy's
strategies in order on a `TrimState` (`proxy.core.trimming.trim`, which says what a trim works
on and returns) and inserts the budget note the policy asks for.

A body refused, by whichever layer, is a `BodyError` naming the field to blame:

    BodyError          proxy.core.plan    a body the guard refuses; `param`: the field, if one is to blame
    ├── AmbiguousJson     proxy.wire.codec   JSON the guard will not guess about (`param`: a key written twice)
    ├── DenseJson         proxy.wire.codec   JSON whose values would take too much memory for its size
    ├── UnreadableJson    proxy.wire.codec   not JSON, ambiguous or too dense, worded for the client
    └── InvalidBody       proxy.core.plan    not a chat-completions body
        └── InvalidRequest  proxy.apis.base  not a body this API accepts (`param` in its spelling)

None of them knows HTTP: `proxy.server.edge.body` turns a `BodyError` into the 400 the server
answers and the message the CLI prints, in one place.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from proxy.core.counting.count_rules import RequestCount
from proxy.core.counting.request_count import RequestCounter
from proxy.core.trimming.budget import PINNED_ROLES, BudgetPolicy, Outcome, TrimResult, input_budget, protected_start
from proxy.core.trimming.compaction import LONGEST_NOTE, CompactionPolicy, budget_note
from proxy.core.trimming.strategies import DEFAULT_PIPELINE, build_pipeline
from proxy.core.trimming.trim import Strategy, TrimState


class BodyError(ValueError):
    """A request body the guard refuses; the message is the client's, `param` names the field
    (or the duplicated key) to blame, when one is."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class InvalidBody(BodyError):
    """The body is not a chat-completions request; `param` names the offending field."""


@dataclass(frozen=True)
class TrimPolicy:
    budget: BudgetPolicy = field(default_factory=BudgetPolicy)
    pipeline: tuple[Strategy, ...] = field(default_factory=lambda: build_pipeline(DEFAULT_PIPELINE))
    overflow: Literal["reject", "forward"] = "reject"
    compaction: CompactionPolicy = field(default_factory=CompactionPolicy)  # budget note, summary room


@dataclass(frozen=True)
class Plan:
    count: RequestCount
    result: TrimResult
    count_seconds: float = 0.0  # measured only when a clock is given
    trim_seconds: float = 0.0
    counter: RequestCounter | None = None  # counts what goes in later (a summary: `with_summary`)
    # The request to forward in its API's own shape (the adapter's rendering of `result`, which is
    # the cut in the chat view the core counts); None: `result.body` is it.
    body: Mapping[str, Any] | None = None
    # `body` differs from the body received though nothing was cut (edits the guard made where the
    # upstream cannot: it is sent as `request`); and fields the guard adds to the upstream's answer
    # for them, in the API's own shape (`proxy.apis.base.EditedRequest`).
    rewritten: bool = False
    answer: Mapping[str, Any] | None = None

    @property
    def request(self) -> Mapping[str, Any]:
        """What to send for this plan, in the API's own shape."""
        return self.result.body if self.body is None else self.body

    def again(self, body: Mapping[str, Any], count_seconds: float) -> Plan:
        """This plan for a body sent again (`proxy.wire.readers`): `body` sent, the lookup's time
        as the count's and none as the trim's (every field named: a copy by `replace` cost 5 us)."""
        return Plan(self.count, self.result, count_seconds, 0.0, self.counter, body, self.rewritten, self.answer)


def validate_body(body: object, checked_messages: int = 0) -> Mapping[str, Any]:
    """The body as a mapping, or InvalidBody saying what is wrong with it; the first
    `checked_messages` messages are known to have passed before."""
    if not isinstance(body, Mapping):
        raise InvalidBody(f"the request body must be a JSON object, not {type(body).__name__}")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise InvalidBody("'messages' is required and must be an array", param="messages")
    if not messages:
        raise InvalidBody("'messages' must not be empty", param="messages")
    for i in range(min(checked_messages, len(messages)), len(messages)):
        message = messages[i]
        # `dict` first: a parsed body holds dicts, and the check against the ABC alone is 10x slower.
        if not isinstance(message, (dict, Mapping)) or not isinstance(message.get("role"), str):
            raise InvalidBody(f"messages[{i}] must be an object with a string 'role'", param=f"messages[{i}]")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidBody("'model' must be a string", param="model")
    return body


def plan_request(
    body: Mapping[str, Any],
    counter: RequestCounter,
    policy: TrimPolicy,
    context_window: int | None = None,
    clock: Callable[[], float] | None = None,
) -> Plan:
    """Count `body` with `counter` (its model profile, tokenizer, count cache and the keys of the
    body's messages: `RequestCounter`) and fit it to its budget as `policy` says. `context_window`
    overrides the profile's (the self-correction of a model whose provider counts more than we
    do); `clock` (e.g. `time.perf_counter`) times the two phases."""
    tick = clock or (lambda: 0.0)
    started = tick()
    count = counter.request(body)
    counted = tick()
    window = counter.profile.context_window if context_window is None else context_window
    result = trim(body, count, counter, policy, window)
    return Plan(count, result, counted - started, tick() - counted, counter)


def trim(
    body: Mapping[str, Any], count: RequestCount, counter: RequestCounter, policy: TrimPolicy, context_window: int
) -> TrimResult:
    """Cut `body` down to its budget with the policy's strategies, in order; see the module docstring."""
    budget, compaction = policy.budget, policy.compaction
    tail = protected_start(body.get("messages") or ())
    if tail is not None:  # most requests fit: decide that without splitting them into turns
        protected = sum(c.tokens for c in count.messages[tail:] if c.role not in PINNED_ROLES)
        pinned = count.fixed_tokens + count.pinned_tokens + protected
        before = input_budget(context_window, body, count.total, pinned, budget)
        if before.fits:
            return TrimResult(body, "unchanged", count.total, count.total, before)
    state = TrimState.start(body, count, counter, budget, context_window)
    before = state.budget()
    if before.fits:
        return TrimResult(body, "unchanged", count.total, count.total, before)
    note_room = counter.message(LONGEST_NOTE, 0).tokens if compaction.budget_note else 0
    summary_room = compaction.summary_room(before.input_budget) if compaction.summarize_dropped else 0
    state.reserve = note_room + summary_room
    applied: list[str] = []
    for strategy in policy.pipeline:
        if state.over() <= 0:
            break
        seen = (len(state.removals), state.total)
        strategy(state)
        if (len(state.removals), state.total) != seen:  # it cut something, or cut again what was cut
            applied.append(strategy.name)
    after = state.budget()
    removals = tuple(sorted(state.removals, key=lambda r: (r.index is None, r.index if r.index is not None else 0)))
    if after.fits:
        if state.over() > 0:  # the room for the note and summary could not be made: go without them
            note_room = summary_room = 0
        inserted: list[Mapping[str, Any]] = []
        dropped = [r for r in removals if r.kind == "dropped"]
        shortened = {r.index for r in removals if r.kind != "dropped" and r.index is not None}
        if note_room and (dropped or shortened):
            removed = sum(r.tokens for r in removals if r.index is not None)
            inserted.append(budget_note(len(dropped), len(shortened), removed))
        note_tokens = sum(counter.message(m, 0).tokens for m in inserted)
        total = state.total + note_tokens
        kept, at = state.kept_body(inserted)
        first = min((r.index for r in removals if r.index is not None), default=len(state.messages))
        prefix = count.fixed_tokens + sum(state.counts[: min(first, at - len(inserted)) if inserted else first])
        return TrimResult(
            kept,
            "trimmed",
            count.total,
            total,
            replace(after, prompt_tokens=total),
            removals,
            tuple(applied),
            cut=state.cut,
            note_tokens=note_tokens,
            summary_room=summary_room if dropped else 0,
            insert_at=at,
            inserted=tuple(range(at - len(inserted), at)),
            prefix_tokens=prefix,
        )
    # Nothing more may be cut: the request goes back untouched, rejected or forwarded as it was.
    outcome: Outcome = "rejected" if policy.overflow == "reject" else "forwarded_over_budget"
    return TrimResult(body, outcome, count.total, state.total, after, removals, tuple(applied))
