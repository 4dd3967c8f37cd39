"""What a trimmed request is told about the history it lost, and the policy that asks for it.

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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from proxy.core.record_fields import field_dict
from proxy.core.trimming.roles import PINNED_ROLES

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
