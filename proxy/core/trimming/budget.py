"""The input budget (context window - output reserve - safety margin), and what a request trimmed
to it is told about the history it lost, with the policy that asks for that.

The output reserve is what the request itself asks for (`max_completion_tokens`, else
`max_tokens`) when it asks; otherwise a share of the window (15%) clamped to [500, 4096]. The
safety margin (5% of the window) absorbs the difference between our count and the provider's.

Some servers (llama.cpp, llama-cpp-python, Ollama) do not refuse a prompt + `max_tokens` over the
window: they lower `max_tokens` to what the window leaves. For them (`output_must_fit` False) the
reserve is what the server will really leave, `min(requested, window - margin - prompt)`, never
below `min_output` (or the requested output, when that is smaller): a 7-token prompt with
`max_tokens` 4096 fits a 2,048-token window, and a long one is cut to leave `min_output` free.

What a trimmed request is told:

- The **budget note** (opt-in, `budget_note`): one short system message of plain fact, "12 earlier
  messages, 8,412 tokens, were removed to fit the context window.", so that the model knows its
  history is partial. The client always learns the same from the response headers and the log.
- The **summary** (opt-in, `summarize_dropped`): one marked system message holding a summary of
  the messages dropped whole, produced by a configured model (see `proxy.core.trimming.compaction` and
  `proxy.server.request.summariser`).

Both go in right after the leading system messages, where they stay unchanged for as long as the
cut does, so they do not cost the prompt cache anything after the cut. Their tokens are counted
inside the budget: when either is asked for, a trimmed request leaves room for it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from proxy.core.record_fields import field_dict
from proxy.core.trimming.turns import PINNED_ROLES


@dataclass(frozen=True, slots=True)
class BudgetPolicy:
    reserve_ratio: float = 0.15
    reserve_min: int = 500
    reserve_max: int = 4096
    safety_ratio: float = 0.05
    safety_min: int = 0
    constrained_below: int = 1000  # history room under which a request is `is_constrained`
    output_must_fit: bool = True  # False: the server lowers max_tokens to what the window leaves
    min_output: int | None = None  # with output_must_fit False: output kept free at least; None: default reserve

    def __post_init__(self) -> None:
        if not 0 <= self.reserve_ratio < 1 or not 0 <= self.safety_ratio < 1:
            raise ValueError("reserve_ratio and safety_ratio must be in [0, 1)")
        if self.reserve_min < 0 or self.reserve_max < self.reserve_min:
            raise ValueError("need 0 <= reserve_min <= reserve_max")
        if self.safety_min < 0 or self.constrained_below < 0:
            raise ValueError("safety_min and constrained_below must be >= 0")
        if self.min_output is not None and self.min_output < 0:
            raise ValueError("min_output must be >= 0")


@dataclass(frozen=True, slots=True)
class Budget:
    context_window: int
    output_reserve: int
    reserve_source: str  # "max_completion_tokens", "max_tokens" or "default"
    safety_margin: int
    input_budget: int
    prompt_tokens: int
    pinned_tokens: int  # what no trimming may remove: system, latest user turn, tools, framing

    @property
    def fits(self) -> bool:
        return self.prompt_tokens <= self.input_budget

    @property
    def overflow(self) -> int:
        """Tokens over the budget; negative when there is room to spare."""
        return self.prompt_tokens - self.input_budget

    @property
    def history_room(self) -> int:
        return max(0, self.input_budget - self.pinned_tokens)

    def is_constrained(self, policy: BudgetPolicy) -> bool:
        return self.history_room < policy.constrained_below

    def to_dict(self, policy: BudgetPolicy) -> dict[str, Any]:
        return {
            "context_window": self.context_window,
            "output_reserve": self.output_reserve,
            "reserve_source": self.reserve_source,
            "safety_margin": self.safety_margin,
            "input_budget": self.input_budget,
            "prompt_tokens": self.prompt_tokens,
            "fits": self.fits,
            "overflow": self.overflow,
            "history_room": self.history_room,
            "is_constrained": self.is_constrained(policy),
        }


def requested_output(body: Mapping[str, Any]) -> tuple[int | None, str]:
    """The output length the request asks for, and the field it came from."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value, key
    return None, "default"


def thinking_budget(body: Mapping[str, Any]) -> int | None:
    """The tokens of extended thinking the request allows (Anthropic's `thinking.budget_tokens`,
    with `type` "enabled"), which Anthropic requires to stay below `max_tokens`; None without."""
    thinking = body.get("thinking")
    if not isinstance(thinking, Mapping) or thinking.get("type") != "enabled":
        return None
    budget = thinking.get("budget_tokens")
    return budget if isinstance(budget, int) and not isinstance(budget, bool) and budget >= 0 else None


def default_reserve(context_window: int, policy: BudgetPolicy) -> int:
    return max(policy.reserve_min, min(policy.reserve_max, int(context_window * policy.reserve_ratio)))


def input_budget(
    context_window: int,
    body: Mapping[str, Any],
    prompt_tokens: int,
    pinned_tokens: int,
    policy: BudgetPolicy,
) -> Budget:
    requested, source = requested_output(body)
    reserve = requested if requested is not None else default_reserve(context_window, policy)
    margin = max(policy.safety_min, math.ceil(context_window * policy.safety_ratio))
    if requested is not None and not policy.output_must_fit:
        reserve = lowered_output(requested, context_window - margin - prompt_tokens, context_window, policy)
        source = source if reserve == requested else f"{source}_lowered_by_the_server"
    return Budget(
        context_window=context_window,
        output_reserve=reserve,
        reserve_source=source,
        safety_margin=margin,
        input_budget=context_window - reserve - margin,
        prompt_tokens=prompt_tokens,
        pinned_tokens=pinned_tokens,
    )


def lowered_output(requested: int, room: int, context_window: int, policy: BudgetPolicy) -> int:
    """The output a server that lowers `max_tokens` will really leave: what was requested, or the
    `room` the prompt leaves in the window when that is less, but never below the policy's
    minimum output (nor above what was requested)."""
    floor = policy.min_output if policy.min_output is not None else default_reserve(context_window, policy)
    return min(requested, max(floor, room))


SUMMARY_HEADER = "[Summary of {count:,} earlier messages, removed to fit the context window]"
SummaryStatus = Literal["produced", "reused", "timeout", "oversize", "failed"]


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    """`budget_note`: insert the budget note. `summarize_dropped`: leave room for a summary of the
    dropped messages, `summary_share` of the input budget and at most `summary_max_tokens`."""

    budget_note: bool = False
    summarize_dropped: bool = False
    summary_share: float = 0.1
    summary_max_tokens: int = 1000

    def __post_init__(self) -> None:
        if not 0 < self.summary_share < 0.5:
            raise ValueError(f"summary_share must be in (0, 0.5), not {self.summary_share!r}")
        if self.summary_max_tokens < 50:
            raise ValueError(f"summary_max_tokens must be at least 50, not {self.summary_max_tokens!r}")

    def summary_room(self, input_budget: int) -> int:
        """Tokens a trimmed request keeps free for the summary message (framing included)."""
        if not self.summarize_dropped:
            return 0
        return max(0, min(self.summary_max_tokens, int(input_budget * self.summary_share)))


def budget_note(dropped: int, shortened: int, tokens: int) -> dict[str, Any]:
    """The note for `dropped` messages removed and `shortened` messages cut, `tokens` in all."""

    def messages(n: int) -> str:
        return f"{n:,} earlier message" + ("" if n == 1 else "s")

    if not shortened:
        verb = "was" if dropped == 1 else "were"
        text = f"{messages(dropped)}, {tokens:,} tokens, {verb} removed to fit the context window."
    elif not dropped:
        verb = "was" if shortened == 1 else "were"
        text = f"{messages(shortened)} {verb} shortened by {tokens:,} tokens to fit the context window."
    else:
        verb = "was" if dropped == 1 else "were"
        text = (
            f"{messages(dropped)} {verb} removed and {shortened:,} shortened, {tokens:,} tokens in all,"
            " to fit the context window."
        )
    return {"role": "system", "content": text}


LONGEST_NOTE = budget_note(10**6, 10**6, 10**9)  # the room a note may need


def summary_message(summary: str, messages: int) -> dict[str, Any]:
    return {"role": "system", "content": SUMMARY_HEADER.format(count=messages) + "\n" + summary}


def insertion_point(messages: Sequence[Any]) -> int:
    """Where inserted messages go: after the leading run of system and developer messages."""
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") not in PINNED_ROLES:
            return i
    return len(messages)


@dataclass(frozen=True, slots=True)
class SummaryReport:
    """What became of the summary of the dropped span: `produced` or `reused` (inserted), or
    `timeout`, `oversize`, `failed` (plain dropping instead)."""

    status: SummaryStatus
    span_hash: str
    messages: int  # messages the summary stands for
    tokens: int  # tokens of the inserted summary message; 0 when none was inserted

    @property
    def inserted(self) -> bool:
        return self.status in ("produced", "reused")

    def to_dict(self) -> dict[str, Any]:
        return field_dict(self)
