"""The input budget (context window - output reserve - safety margin) a request must fit, and
what fitting it came to.

The output reserve is what the request itself asks for (`max_completion_tokens`, else
`max_tokens`) when it asks; otherwise a share of the window (15%) clamped to [500, 4096]. The
safety margin (5% of the window) absorbs the difference between our count and the provider's.

Some servers (llama.cpp, llama-cpp-python, Ollama) do not refuse a prompt + `max_tokens` over the
window: they lower `max_tokens` to what the window leaves. For them (`output_must_fit` False) the
reserve is what the server will really leave, `min(requested, window - margin - prompt)`, never
below `min_output` (or the requested output, when that is smaller): a 7-token prompt with
`max_tokens` 4096 fits a 2,048-token window, and a long one is cut to leave `min_output` free.

What fitting came to, `TrimResult` (with one `Removal` per message dropped or shortened, and
`HistoryCut`, where the history was cut and why), is here too, with what decides that a request
fits before any trim runs: which messages are never cut (`PINNED_ROLES`; the protected tail from
the latest user message, `protected_start`). A request that fits needs nothing else from
`proxy.core.trimming`; the strategies and what they work on (`proxy.core.trimming.trim`) run
only for one that does not.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from proxy.core.record_fields import field_dict

PINNED_ROLES = frozenset({"system", "developer"})
TOOL_RESULT_ROLES = frozenset({"tool", "function"})


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


SummaryStatus = Literal["produced", "reused", "timeout", "oversize", "failed"]


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


RemovalKind = Literal["dropped", "truncated", "cleared", "image_dropped", "max_tokens_clamped"]
Outcome = Literal["unchanged", "trimmed", "rejected", "forwarded_over_budget"]


@dataclass(frozen=True, slots=True)
class Removal:
    index: int | None  # position in the original `messages`; None for a request field
    role: str | None
    kind: RemovalKind
    tokens: int
    hash: str  # short content hash of what was removed, to match log lines without logging content
    strategy: str

    def to_dict(self) -> dict[str, Any]:
        return field_dict(self)


@dataclass(frozen=True)
class TrimResult:
    body: Mapping[str, Any]
    outcome: Outcome
    tokens_before: int
    tokens_after: int
    budget: Budget  # as it stands for the body returned (after any max_tokens clamp)
    removals: tuple[Removal, ...] = ()
    strategies: tuple[str, ...] = ()  # the strategies that changed something, in order
    cut: HistoryCut | None = None  # where drop_oldest_turns cut the history, and why
    note_tokens: int = 0  # tokens of the inserted budget note; 0 when none
    summary_room: int = 0  # tokens kept free for a summary of the dropped messages; 0 when none is due
    insert_at: int = 0  # where in the returned messages a summary goes (where the dropped history was)
    summary: SummaryReport | None = None  # what became of the summary, once the server has tried
    inserted: tuple[int, ...] = ()  # positions in the returned messages of messages the trim added
    # Tokens the returned request starts with that are the received request's own (tools, system,
    # messages before the first change): what a prompt cache of the conversation still serves.
    prefix_tokens: int = 0

    @property
    def changed(self) -> bool:
        return self.outcome == "trimmed"

    @property
    def fits(self) -> bool:
        return self.tokens_after <= self.budget.input_budget

    def rejection_message(self, opening: str = "") -> str:
        """Why the request is refused, after `opening`: the sentence the provider words its own
        overflow error with (the adapter of the request's API shape picks it, `openai_overflow`,
        `anthropic_overflow`; clients act on it: litellm's ContextWindowExceededError; Claude Code
        lowers max_tokens on Anthropic's max_tokens sentence, stops on "prompt is too long")."""
        explanation = self._explanation()
        return f"{opening} {explanation}" if opening else explanation

    def openai_overflow(self) -> str:
        """OpenAI's overflow sentence, with the code in the text too: langchain-openai, among
        others, looks for it in the message."""
        return f"{self._openai_sentence()} (context-guard, context_length_exceeded)"

    def _openai_sentence(self) -> str:
        # OpenAI's own wording (numbers without separators, as it writes them), for the case it fits.
        b, prompt = self.budget, self.tokens_after
        window, asked = b.context_window, self.tokens_after + b.output_reserve
        if prompt > window:
            return (
                f"This model's maximum context length is {window} tokens. However, your messages resulted in "
                f"{prompt} tokens. Please reduce the length of the messages."
            )
        stated = f"{window} tokens"
        if asked <= window:  # over only by the guard's safety margin: the length that counts is the smaller one
            window = window - b.safety_margin
            margin = f"the guard keeps {b.safety_margin} of the model's {b.context_window} as a safety margin"
            stated = f"{window} tokens ({margin})"
        return (
            f"This model's maximum context length is {stated}. However, you requested {asked} tokens "
            f"({prompt} in the messages, {b.output_reserve} in the completion). Please reduce the length of the "
            f"messages or completion."
        )

    def anthropic_overflow(self) -> str:
        """Anthropic's overflow sentence."""
        b, limit = self.budget, self.budget.context_window - self.budget.safety_margin
        if b.input_budget <= 0 or (b.reserve_source != "default" and self.tokens_after <= limit):
            return (
                f"input length and `max_tokens` exceed context limit: {self.tokens_after} + {b.output_reserve} > "
                f"{limit}, decrease input length or `max_tokens` and try again."
            )
        return f"prompt is too long: {self.tokens_after} tokens > {b.input_budget} maximum."

    def _explanation(self) -> str:
        b = self.budget
        if b.input_budget <= 0:
            room = (
                f"The model's window of {b.context_window:,} tokens leaves no room for input once the "
                f"output reserve ({b.output_reserve:,}, {b.reserve_source.replace('_', ' ')}) and the safety "
                f"margin ({b.safety_margin:,}) are set aside. Lower max_tokens."
            )
            return f"This request has {self.tokens_before:,} input tokens. {room}"
        cut = ""
        if self.removals:
            removed = sum(r.tokens for r in self.removals)
            cut = f" (it cut {len(self.removals):,} items, {removed:,} tokens, by {', '.join(self.strategies)})"
        return (
            f"This request has {self.tokens_before:,} input tokens; after every cut the guard may make{cut} it "
            f"still has {self.tokens_after:,}, and the model's input budget is {b.input_budget:,} tokens "
            f"(context window {b.context_window:,} - output reserve {b.output_reserve:,} "
            f"- safety margin {b.safety_margin:,}). Shorten the system prompt or the latest message, "
            f"or lower max_tokens."
        )

    def report(self, policy: BudgetPolicy) -> dict[str, Any]:
        return {
            "outcome": self.outcome,
            "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after,
            "budget": self.budget.to_dict(policy),
            "removed": [r.to_dict() for r in self.removals],
            "strategies": list(self.strategies),
            "cut": self.cut.to_dict() if self.cut is not None else None,
            "note_tokens": self.note_tokens,
            "summary": self.summary.to_dict() if self.summary is not None else None,
        }


def latest_user_index(messages: Sequence[Any]) -> int | None:
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if isinstance(message, Mapping) and message.get("role") == "user":
            return i
    return None


def protected_start(messages: Sequence[Any]) -> int | None:
    """Where `split_conversation(messages)`'s protected tail starts (the latest user message), or
    None when finding that needs the full split.

    It does not when a user message exists and no tool result follows it: a unit only reaches past
    its first message through tool results, so then no unit can reach across the latest user
    message, and the protected tail starts exactly there. This is the common shape of a request,
    and deciding that a request fits needs only this and the pinned messages' tokens.
    """
    latest = latest_user_index(messages)
    if latest is None:
        return None
    for message in messages[latest + 1 :]:
        if isinstance(message, (dict, Mapping)) and message.get("role") in TOOL_RESULT_ROLES:
            return None
    return latest


CutReason = Literal["low_water", "minimal"]


@dataclass(frozen=True, slots=True)
class HistoryCut:
    """Where `drop_oldest_turns` cut the history, and why: `low_water` on a cut position (cache
    stable, down to the low-water mark), or `minimal` (only what was needed: the cut position
    fell inside the turns the history guarantee keeps, or the low-water mark is off). Positions
    count from the end of the opening kept before the cut (`head_tokens`; 0 when none is)."""

    reason: CutReason
    position: int  # history tokens before the cut, counted from the history's start
    step: int  # the distance between cut positions, in tokens (1 for a minimal cut)
    dropped_turns: int
    first_kept: int | None  # index in the original messages of the first history message kept
    partial_index: int | None  # index of the message shortened to keep the straddling turn in part
    partial_tokens: int  # tokens that turn keeps (0 when it went whole)
    head_tokens: int = 0  # tokens of the opening kept before the cut (`head_share`)
    head_turns: int = 0  # opening turns kept, the one straddling its end included
    head_partial_index: int | None = None  # index of the message shortened to end the opening

    def to_dict(self) -> dict[str, Any]:
        """The cut as the log line shows it: its fields, all plain values, by their names."""
        return field_dict(self)
