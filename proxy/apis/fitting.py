"""One parsed request through the core, in its API's own shape: `fit()` counts and trims it with
`proxy.core.plan.plan_request` and has the adapter render the cut (`Fitted`), the one call the
server needs; `Counting` says what it is counted with. A request that asks the provider for edits
of its own (Anthropic's context editing, `Adapter.edited`) is counted as the provider will see it
once they ran; `count_kind` says what kind of count a plan's is (exact, an upper bound, an
estimate, incomplete). Pure: no I/O, no aiohttp."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from proxy.apis.base import Adapter, EditedRequest, Parsed
from proxy.core.counting.count_cache import CountCache
from proxy.core.counting.request_count import RequestCounter
from proxy.core.counting.tokenizer import Tokenizer
from proxy.core.models.model_registry import ModelProfile
from proxy.core.plan import Plan, TrimPolicy, plan_request
from proxy.core.trimming.budget import BudgetPolicy


@dataclass(frozen=True)
class Fitted:
    """A request counted, trimmed and written back: `body` is what to forward (the very body
    received when nothing changed), `plan` what the core decided; `original_tokens`, the count
    before the edits the request asks the provider for (None: it asks for none), and `edited`
    the request after them, which a later rendering of the plan's view writes into."""

    parsed: Parsed
    plan: Plan
    body: Mapping[str, Any]
    original_tokens: int | None = None
    edited: Parsed | None = None  # what the plan counts and cuts, when not `parsed` (after its edits)

    @property
    def changed(self) -> bool:
        return self.body is not self.parsed.body

    @property
    def exact(self) -> bool:
        return self.plan.count.exact and self.parsed.exact and not self.parsed.server_state

    def report(self) -> dict[str, Any]:
        """What a trim report says about this request beyond the core's plan: its API, whether the
        count is exact, and where in the original body each removal was (the core's indices are
        positions in the view). Never content; its notes are the request record's."""
        parsed = self.parsed
        return {
            "api": parsed.api,
            "exact": self.exact,
            "server_state": parsed.server_state,
            "removed": [
                {**r.to_dict(), "origin": parsed.where(r.index) if r.index is not None else parsed.reserve_field}
                for r in self.plan.result.removals
            ],
        }


@dataclass(frozen=True, slots=True)
class Counting:
    """What a request is counted and budgeted with, the one type for it: the model's profile, the
    tokenizer (the model's own, the backend's, or a calibrated estimate), the count cache to go
    through (None: past it), the window when it is not the profile's (a learned correction), the
    model it is counted as (after a route's rename; empty: the one it names) and the upstream's
    budget policy (None: the configured one)."""

    profile: ModelProfile
    tokenizer: Tokenizer
    cache: CountCache | None = None
    context_window: int | None = None
    # The upstream cannot apply the edits a request asks of the provider (Anthropic's context
    # editing): the guard applies them and sends the edited body (`Adapter.edited`).
    edits_by_guard: bool = False
    model: str = ""
    budget: BudgetPolicy | None = None


def fit(
    adapter: Adapter, parsed: Parsed, counting: Counting, policy: TrimPolicy, clock: Callable[[], float] | None = None
) -> Fitted:
    """Count and trim `parsed` with the core, and render the result in the API's own shape. The
    adapter may replace the policy's strategies for this request (`Adapter.pipeline`)."""
    tokenizer = counting.tokenizer
    profile = adapter.profile(counting.profile, parsed)
    counter = RequestCounter(profile, tokenizer, counting.cache, parsed.message_hashes, parsed.shared_messages)
    pipeline = adapter.pipeline(parsed)
    if pipeline is not None:
        policy = replace(policy, pipeline=pipeline)
    budget = counting.budget
    if budget is not None and budget is not policy.budget:  # most upstreams keep the configured one
        policy = replace(policy, budget=budget)
    edited = adapter.edited(parsed, counter, counting.edits_by_guard)
    if edited is not None:  # counted as the provider will see it (other messages: a counter of their own)
        if edited.parsed.chat is not parsed.chat:
            counter = RequestCounter(profile, tokenizer, counting.cache)
        view = adapter.counted_view(edited.parsed, tokenizer)
        return _edited_fit(adapter, parsed, edited, plan_request(view, counter, policy, counting.context_window, clock))
    plan = plan_request(adapter.counted_view(parsed, tokenizer), counter, policy, counting.context_window, clock)
    result = plan.result
    if result.outcome != "trimmed":  # the body as received goes (a chat body is the plan's own view)
        return Fitted(parsed, plan if plan.request is parsed.body else replace(plan, body=parsed.body), parsed.body)
    body = adapter.render(parsed, result.body, result.removals, result.inserted)
    return Fitted(parsed, replace(plan, body=body), body)


def _edited_fit(adapter: Adapter, parsed: Parsed, edited: EditedRequest, plan: Plan) -> Fitted:
    """`fit` for a request counted after its edits (`plan`): what still does not fit was cut from
    the edited body; what fits goes as `edited.send` says (the body as received, for a provider
    that edits it itself)."""
    result = plan.result
    original = plan.count.total if edited.original_tokens is None else edited.original_tokens
    if result.outcome != "trimmed":
        body = parsed.body if edited.send is None else edited.send
        plan = replace(plan, body=body, rewritten=edited.send is not None, answer=edited.answer)
        return Fitted(parsed, plan, body, original, edited.parsed)
    body = adapter.render(edited.parsed, result.body, result.removals, result.inserted)
    return Fitted(parsed, replace(plan, body=body, answer=edited.answer), body, original, edited.parsed)


# Notes of what the guard now counts after all: held context by id, encrypted reasoning by its bound.
_COUNTED_AFTER_ALL = (
    "previous_response_id:",
    "conversation:",
    "previous_interaction_id",
    "cachedContent:",
    "encrypted reasoning",
)


def count_kind(exact: bool, parsed: Parsed, source: str, held: str | None) -> str:
    """What kind of count a plan's is (`COUNT_HEADER`): `exact`; `upper-bound` (a bound tokenizer,
    a part the adapter bounded, a ciphertext's size: its note says "upper bound"); `estimate` (parts
    estimated, a calibrated estimate, held context sized from the provider's reports in the
    ledger); `incomplete` (what the provider adds is not counted at all). `exact`: the tokenizer's
    count is; `held`: where the held context's size came from."""
    kinds = set()
    for note in parsed.notes:
        if note.startswith(("not counted", "cachedContent")):
            kinds.add("counted" if any(part in note for part in _COUNTED_AFTER_ALL) else "incomplete")
        elif "upper bound" in note:
            kinds.add("upper-bound")
        elif not note.startswith("truncation"):
            kinds.add("estimate")
    if held in ("unknown", "partial") or "incomplete" in kinds:
        return "incomplete"
    # A cache's size is the provider's own count; a chain's, its last answer's input + output.
    chained = held == "ledger" and any(context.kind != "cache" for context in parsed.held)
    if "estimate" in kinds or source in ("calibrated", "estimate") or chained:
        return "estimate"
    return "exact" if exact and "upper-bound" not in kinds else "upper-bound"
