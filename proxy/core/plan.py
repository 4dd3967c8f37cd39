"""The one entry point of the core: validate a body, count it, budget it, trim it.

`plan_request()` is pure and synchronous, and safe to call from a worker thread (tiktoken
releases the GIL while it encodes; the count cache takes a lock), so that the server can move
the counting of a very large body off its event loop.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from proxy.core.body_error import BodyError
from proxy.core.counting.count_cache import CountCache
from proxy.core.counting.count_rules import RequestCount
from proxy.core.counting.request_count import RequestCounter
from proxy.core.counting.tokenizer import Tokenizer
from proxy.core.models.model_registry import ModelProfile
from proxy.core.trimming.budget import BudgetPolicy
from proxy.core.trimming.notes import CompactionPolicy
from proxy.core.trimming.strategies import DEFAULT_PIPELINE, build_pipeline
from proxy.core.trimming.trim import Strategy, TrimResult, trim


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

    @property
    def request(self) -> Mapping[str, Any]:
        """What to send for this plan, in the API's own shape."""
        return self.result.body if self.body is None else self.body

    def again(self, body: Mapping[str, Any], count_seconds: float) -> Plan:
        """This plan for a body sent again (`proxy.server.request.resent`): `body` sent, the lookup's time
        as the count's and none as the trim's (every field named: a copy by `replace` cost 5 us)."""
        return Plan(self.count, self.result, count_seconds, 0.0, self.counter, body)


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
    profile: ModelProfile,
    tokenizer: Tokenizer,
    policy: TrimPolicy,
    cache: CountCache | None = None,
    pipeline: Sequence[Strategy] | None = None,
    context_window: int | None = None,
    clock: Callable[[], float] | None = None,
    message_hashes: Sequence[int] = (),
    shared_messages: int = 0,
) -> Plan:
    """Count `body` for `profile` and fit it to its budget. `context_window` overrides the
    profile's (the self-correction of a model whose provider counts more than we do); `clock`
    (e.g. `time.perf_counter`) times the two phases; `message_hashes`, one per message, key the
    count cache instead of hashes of the messages written back, and `shared_messages` says how
    many of them an earlier body held (`RequestCounter.request`)."""
    tick = clock or (lambda: 0.0)
    counter = RequestCounter(profile, tokenizer, cache)
    started = tick()
    count = counter.request(body, message_hashes, shared_messages)
    counted = tick()
    result = trim(
        body,
        count,
        counter,
        policy.pipeline if pipeline is None else pipeline,
        policy.budget,
        profile.context_window if context_window is None else context_window,
        policy.overflow,
        policy.compaction,
    )
    return Plan(count, result, counted - started, tick() - counted, counter)
