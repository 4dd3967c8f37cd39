"""What fitting a counted request that does not fit its budget works on: `TrimState`.

`proxy.core.plan.trim()` runs the configured strategies in order on a `TrimState` and returns a
`TrimResult` (`proxy.core.trimming.budget`): the body to forward, the tokens before and after, the
budget, and one `Removal` per message dropped or shortened. A request that already fits never gets
here: it comes back as the very same object, decided from the budget alone.

The strategies work on a `TrimState` that keeps a running total: a strategy that drops a message
subtracts its known count, one that shortens a message recounts that message alone. Nothing
recounts the whole request per step. A message is reported once: one that is shortened and later
dropped in the same trim is reported as dropped, with its original tokens.

When the `CompactionPolicy` asks for a budget note or a summary, a trimmed request is cut to leave
room for them (`TrimState.reserve`); the note is inserted by `trim()`, the summary later, once the
server has it (`proxy.core.trimming.compaction`). `TrimResult.cut` says where the history was cut and why.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import orjson

from proxy.core.counting.count_rules import RequestCount
from proxy.core.counting.request_count import RequestCounter
from proxy.core.trimming.budget import (
    Budget,
    BudgetPolicy,
    HistoryCut,
    Removal,
    RemovalKind,
    input_budget,
    insertion_point,
    requested_output,
)
from proxy.core.trimming.turns import Conversation, split_conversation


class Strategy(Protocol):
    @property
    def name(self) -> str: ...

    def __call__(self, state: TrimState) -> None: ...


def content_hash(value: object) -> str:
    """The first 12 hex digits of `content_digest(value)`: the same message always gives the same
    hash, so log lines can be matched without content. Short, for reading: never a key that one
    client's content could share with another's (that is the whole digest)."""
    return content_digest(value)[:12]


def content_digest(value: object) -> str:
    """The SHA-256 of `value` as compact JSON with sorted keys, in hex."""
    try:
        data = orjson.dumps(value, option=orjson.OPT_SORT_KEYS, default=str)
    except TypeError:  # integers beyond 64 bits
        data = json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str).encode(
            "utf-8", "surrogatepass"
        )
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Snapshot:
    """Messages of a `TrimState` as they were, with its total and removals (`TrimState.snapshot`)."""

    messages: tuple[tuple[int, Any, int], ...]
    total: int
    removals: list[Removal]
    shortened: dict[int, int]


@dataclass
class TrimState:
    """The request as the pipeline is cutting it. Strategies read and change it through the
    methods below, which keep the running total and the list of removals right."""

    body: Mapping[str, Any]
    counter: RequestCounter
    policy: BudgetPolicy
    context_window: int
    conversation: Conversation
    messages: list[Any]
    counts: list[int]
    fixed_tokens: int
    total: int
    dropped: set[int] = field(default_factory=set)
    removals: list[Removal] = field(default_factory=list)
    output_override: tuple[str, int] | None = None
    reserve: int = 0  # tokens to leave free for what goes in after the cut (budget note, summary)
    shortened: dict[int, int] = field(default_factory=dict)  # index -> where in `removals` its (not a drop) is
    cut: HistoryCut | None = None
    opening_end: int | None = None  # index of the last message of the opening kept before the cut
    compaction_request: bool = False  # the client asks to summarise its conversation: keep its opening
    _input_budget: int | None = None

    @classmethod
    def start(
        cls, body: Mapping[str, Any], count: RequestCount, counter: RequestCounter, policy: BudgetPolicy, window: int
    ) -> TrimState:
        messages = list(body.get("messages") or ())
        return cls(
            body=body,
            counter=counter,
            policy=policy,
            context_window=window,
            conversation=split_conversation(messages),
            messages=messages,
            counts=[m.tokens for m in count.messages],
            fixed_tokens=count.fixed_tokens,
            total=count.total,
        )

    def budget(self) -> Budget:
        body: Mapping[str, Any] = self.body
        if self.output_override is not None:
            key, value = self.output_override
            body = {**self.body, key: value}
        indices = (i for i in (*self.conversation.pinned, *self.conversation.protected) if i not in self.dropped)
        return input_budget(
            self.context_window, body, self.total, self.fixed_tokens + sum(self.counts[i] for i in indices), self.policy
        )

    def over(self) -> int:
        """Tokens still to remove; zero or less once the request fits. O(1): strategies call it
        after every cut."""
        if self._input_budget is None:
            self._input_budget = self.budget().input_budget
        return self.total + self.reserve - self._input_budget

    def input_budget(self) -> int:
        if self._input_budget is None:
            self._input_budget = self.budget().input_budget
        return self._input_budget

    def drop(self, index: int, strategy: str) -> None:
        """Drop message `index`; a message already dropped stays dropped, and is reported once. A
        message shortened earlier in this trim is reported as dropped, with its original tokens."""
        if index in self.dropped:
            return
        original = self.body["messages"][index]
        tokens = self.counts[index]
        dropped = Removal(index, _role(original), "dropped", tokens, content_hash(original), strategy)
        if index in self.shortened:  # its removal becomes the drop, in place: dropping 2,000 stays linear
            at = self.shortened.pop(index)
            self.removals[at] = replace(dropped, tokens=tokens + self.removals[at].tokens)
        else:
            self.removals.append(dropped)
        self.dropped.add(index)
        self.total -= self.counts[index]
        self.counts[index] = 0

    def replace(self, index: int, message: Mapping[str, Any], kind: RemovalKind, strategy: str, removed: object) -> int:
        """Put a shortened `message` at `index`; returns the tokens saved."""
        before = self.counts[index]
        after = self.counter.message(message, index).tokens
        self.messages[index] = message
        self.counts[index] = after
        self.total += after - before
        if index in self.shortened:  # changed again: still one removal, with both savings
            at = self.shortened[index]
            first = self.removals[at]
            # Cleared after it was shortened: what is left of it is the placeholder, and says so.
            kind, strategy = (kind, strategy) if kind == "cleared" else (first.kind, first.strategy)
            self.removals[at] = replace(first, kind=kind, strategy=strategy, tokens=first.tokens + before - after)
        else:
            self.shortened[index] = len(self.removals)
            self.removals.append(Removal(index, _role(message), kind, before - after, content_hash(removed), strategy))
        return before - after

    def snapshot(self, indices: Sequence[int]) -> Snapshot:
        """What `restore` needs to undo changes to the messages at `indices` (an attempt that may
        not succeed: keeping a turn in part)."""
        return Snapshot(
            tuple((i, self.messages[i], self.counts[i]) for i in indices),
            self.total,
            list(self.removals),
            dict(self.shortened),
        )

    def restore(self, snapshot: Snapshot) -> None:
        for index, message, count in snapshot.messages:
            self.messages[index], self.counts[index] = message, count
        self.total, self.removals, self.shortened = snapshot.total, snapshot.removals, snapshot.shortened

    def clamp_output(self, key: str, value: int, strategy: str) -> None:
        requested, _ = requested_output(self.body)
        self.output_override = (key, value)
        self._input_budget = None
        self.removals.append(
            Removal(None, None, "max_tokens_clamped", (requested or 0) - value, content_hash(requested), strategy)
        )

    def kept_body(self, inserted: Sequence[Mapping[str, Any]] = ()) -> tuple[dict[str, Any], int]:
        """The body with the messages kept, and `inserted` where the dropped history was: after
        the leading system messages, or after the opening when one was kept. Returns the body and
        the position in its messages just after the inserted ones."""
        body = dict(self.body)
        kept = [m for i, m in enumerate(self.messages) if i not in self.dropped]
        if self.opening_end is None:
            at = insertion_point(kept)
        else:
            at = sum(1 for i in range(self.opening_end + 1) if i not in self.dropped)
        body["messages"] = [*kept[:at], *inserted, *kept[at:]]
        if self.output_override is not None:
            key, value = self.output_override
            body[key] = value
        return body, at + len(inserted)


def _role(message: object) -> str | None:
    role = message.get("role") if isinstance(message, Mapping) else None
    return role if isinstance(role, str) else None
