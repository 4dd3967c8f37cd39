"""The trimming strategies, each a small object configured once and called per request.

Every strategy acts only while the request is over budget, and stops as soon as it fits. In the
default order they drop the oldest history first, then shorten oversized content, and touch the
latest user message only as a last resort:

    drop_images          replace the oldest images with a short marker (opt-in: list it first)
    clamp_max_tokens     lower the request's own max_tokens, never below a floor nor to its
                         thinking budget (opt-in)
    clear_tool_results   clear old tool results in cache-stable blocks (the call kept, a placeholder
                         in place of its output), then drop old tool exchanges whole, keeping the
                         newest results; a compaction request's results shortened evenly instead
                         (see `proxy.core.trimming.clearing`)
    drop_old_tool_exchanges  drop old tool calls with their results before whole turns (opt-in)
    drop_oldest_turns    keep the opening, then drop whole turns, oldest first, keeping the
                         history guarantee; by default down to a cache-stable cut position
                         (see `proxy.core.trimming.history`), the turn that straddles it kept in part
    shrink_tool_results  cut oversized tool results to their cap, middle-out, oldest first
    shrink_messages      the same for long older user and assistant messages
    drop_recent_turns    drop the turns the history guarantee kept, once shrinking could not help
    shrink_latest_user   middle-out cut of the latest user message (last resort)
    shrink_system        middle-out cut of the system prompt (opt-in: list it to allow it)

`STRATEGIES` is the registry the settings loader builds them from; an unknown name is an error
that lists the known ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.core.trimming.budget import requested_output, thinking_budget
from proxy.core.trimming.clearing import ClearToolResults, clear_result, tool_results
from proxy.core.trimming.history import (
    DropOldestTurns,
    check_at_least,
    drop_groups,
    is_image,
    keep_in_part,
    shorten_message,
    unguaranteed,
    without_images,
)
from proxy.core.trimming.trim import Strategy, TrimState
from proxy.core.trimming.turns import MARKER, Turn, is_flagged


@dataclass(frozen=True)
class DropOldToolExchanges:
    """Drop old tool exchanges (a call with all its results) before whole turns, oldest first,
    outside the history guarantee: an agent's old tool output usually weighs most and matters
    least, while the user's questions and the assistant's answers around it stay. List it before
    `drop_oldest_turns` to give tool exchanges the lower priority."""

    min_history_turns: int = 1
    min_history_tokens: int = 0
    name: str = "drop_old_tool_exchanges"

    def __call__(self, state: TrimState) -> None:
        turns = unguaranteed(state, self.min_history_turns, self.min_history_tokens)
        exchanges = (unit for turn in turns for unit in turn.units if unit.is_tool_exchange)
        drop_groups(state, exchanges, self.name)


@dataclass(frozen=True)
class DropRecentTurns:
    """Drop the turns the history guarantee kept, oldest first: better a short history than a
    rejected request. The last turn to go is kept in part instead, its largest message shortened
    middle-out, when that makes the room and leaves it at least `min_partial_tokens`.

    Then, before anything is refused, fewer of the newest tool exchanges are kept whole: the
    results of the exchanges after the latest user message are cleared, oldest first, down to the
    newest one, and those exchanges dropped whole, oldest first, when their calls still do not fit.
    The opening that `drop_oldest_turns` kept goes after them (so that the prefix the provider
    cached stays as long as it can; a compaction request keeps it), and the newest result is
    shortened, as little as it takes, as the very last resort."""

    min_partial_tokens: int = 64
    name: str = "drop_recent_turns"

    def __post_init__(self) -> None:
        check_at_least(self.name, "min_partial_tokens", self.min_partial_tokens, 1)

    def __call__(self, state: TrimState) -> None:
        turns = state.conversation.turns
        end = state.opening_end
        opening = 0 if end is None else next((n for n, t in enumerate(turns) if t.indices[-1] >= end), 0) + 1
        # A client's compaction request keeps its opening: without it the summary has no task.
        opening = max(opening, 1) if state.compaction_request else opening
        if self._drop_turns(state, turns[opening:]):
            return
        newest = self._fewer_exchanges(state)
        if not state.compaction_request and self._drop_turns(state, turns[:opening]):
            return
        if newest is not None and state.over() > 0:
            shorten_message(state, newest, max(self.min_partial_tokens, state.counts[newest] - state.over()), self.name)

    def _drop_turns(self, state: TrimState, turns: Sequence[Turn]) -> bool:
        """Drop `turns` in order, the last to go kept in part; whether the request fits."""
        for turn in turns:
            over = state.over()
            if over <= 0:
                return True
            if turn.indices[0] in state.dropped:
                continue
            tokens = sum(state.counts[i] for i in turn.indices)
            partial = tokens - over >= self.min_partial_tokens
            if partial and keep_in_part(state, turn, tokens - over, self.min_partial_tokens, self.name) is not None:
                return True
            drop_groups(state, (turn,), self.name)
        return state.over() <= 0

    def _fewer_exchanges(self, state: TrimState) -> int | None:
        """Clear the results of the exchanges after the latest user message but the newest, oldest
        first, then drop those exchanges whole; returns the newest result (None when there is none)."""
        tail = set(state.conversation.protected)
        results = [i for i in tool_results(state) if i in tail]
        if not results:
            return None
        for index in results[:-1]:
            if state.over() <= 0:
                break
            clear_result(state, index, self.name)
        newest = results[-1]
        older = (u for u in state.conversation.tail if u.is_tool_exchange and newest not in u.indices)
        drop_groups(state, older, self.name)
        return newest


@dataclass(frozen=True)
class ShrinkContent:
    """Cut messages of the given roles that are over `cap` tokens, middle-out. Roles are taken in
    `roles` order (the priority), and oldest first within a role; `caps` overrides `cap` per role.
    Pinned messages and the latest user message are never candidates; `include_protected` admits
    the tool results after it. A cap is never more than `cap_share` of the input budget, so that
    on a small window old messages are shortened before recent turns are dropped.

    A history message is cut to its cap exactly, so that the next request of the conversation,
    which needs at least as much room, cuts it the same way and the prefix the provider cached
    holds. A message after the latest user message (the exchange under way) is cut no further
    than the request needs, and never below its cap."""

    name: str
    roles: tuple[str, ...]
    cap: int = 2000
    caps: Mapping[str, int] = field(default_factory=dict)
    include_protected: bool = False
    cap_share: float = 0.25

    def __post_init__(self) -> None:
        check_at_least(self.name, "cap", self.cap, 1)
        for role, cap in self.caps.items():
            check_at_least(self.name, f"caps.{role}", cap, 1)
        if isinstance(self.cap_share, bool) or not isinstance(self.cap_share, int | float):
            raise ValueError(f"{self.name}: cap_share must be a number, not {self.cap_share!r}")
        if not 0 < self.cap_share <= 1:
            raise ValueError(f"{self.name}: cap_share must be in (0, 1], not {self.cap_share!r}")

    def __call__(self, state: TrimState) -> None:
        conversation = state.conversation
        history = set(conversation.history)
        allowed = set(history)
        if self.include_protected:
            allowed |= set(conversation.protected)
        ceiling = max(1, int(self.cap_share * state.input_budget()))
        for role in self.roles:
            cap = min(self.caps.get(role, self.cap), ceiling)
            for index in sorted(allowed):
                if state.over() <= 0:
                    return
                message = state.messages[index]
                if index in state.dropped or _role(message) != role or state.counts[index] <= cap:
                    continue
                target = cap if index in history else max(cap, state.counts[index] - state.over())
                shorten_message(state, index, target, self.name)


@dataclass(frozen=True)
class ShrinkPinned:
    """Middle-out cut of the latest user message or of the system prompt: as little as it takes,
    and never below `min_tokens`."""

    name: str
    which: str  # "latest_user" or "system"
    min_tokens: int = 256

    def __call__(self, state: TrimState) -> None:
        conversation = state.conversation
        if self.which == "latest_user":
            candidates = [i for i in conversation.protected if _role(state.messages[i]) == "user"][:1]
        else:  # a compaction marker is what the provider starts from: never cut
            pinned = (i for i in conversation.pinned if not is_flagged(state.messages[i], MARKER))
            candidates = sorted(pinned, key=lambda i: -state.counts[i])
        for index in candidates:
            if state.over() <= 0:
                return
            target = max(self.min_tokens, state.counts[index] - state.over())
            shorten_message(state, index, target, self.name)


@dataclass(frozen=True)
class DropImages:
    """Replace images with a short text marker, oldest first, before any text is dropped. The
    latest user message keeps its images unless `include_latest` is set."""

    include_latest: bool = False
    name: str = "drop_images"

    def __call__(self, state: TrimState) -> None:
        conversation = state.conversation
        latest = next((i for i in conversation.protected if _role(state.messages[i]) == "user"), None)
        for index in sorted({*conversation.history, *conversation.protected}):
            if state.over() <= 0:
                return
            message = state.messages[index]
            if index in state.dropped or (index == latest and not self.include_latest):
                continue
            content = message.get("content") if isinstance(message, Mapping) else None
            if not isinstance(content, list) or not any(is_image(p) for p in content):
                continue
            new_message, removed = without_images(message)
            state.replace(index, new_message, "image_dropped", self.name, removed)


@dataclass(frozen=True)
class ClampMaxTokens:
    """Lower the request's own `max_tokens` / `max_completion_tokens` to make room, never below
    `floor`, nor to or below its extended thinking's `budget_tokens` (Anthropic refuses a
    `max_tokens` that is not above it). A request that sets neither is left to the other strategies."""

    floor: int = 1024
    name: str = "clamp_max_tokens"

    def __call__(self, state: TrimState) -> None:
        requested, key = requested_output(state.body)
        thinking = thinking_budget(state.body)
        floor = self.floor if thinking is None else max(self.floor, thinking + 1)
        if requested is None or requested <= floor:
            return
        lowered = max(floor, requested - state.over())
        if lowered < requested:
            state.clamp_output(key, lowered, self.name)


def _role(message: object) -> str | None:
    role = message.get("role") if isinstance(message, Mapping) else None
    return role if isinstance(role, str) else None


def _shrink_tool_results(**options: Any) -> Strategy:
    return ShrinkContent("shrink_tool_results", ("tool", "function"), **{"include_protected": True, **options})


def _shrink_messages(**options: Any) -> Strategy:
    roles = tuple(options.pop("roles", ("assistant", "user")))
    return ShrinkContent("shrink_messages", roles, **options)


STRATEGIES: Mapping[str, Callable[..., Strategy]] = {
    "drop_images": DropImages,
    "clamp_max_tokens": ClampMaxTokens,
    "clear_tool_results": ClearToolResults,
    "drop_old_tool_exchanges": DropOldToolExchanges,
    "drop_oldest_turns": DropOldestTurns,
    "shrink_tool_results": _shrink_tool_results,
    "shrink_messages": _shrink_messages,
    "drop_recent_turns": DropRecentTurns,
    "shrink_latest_user": lambda **o: ShrinkPinned("shrink_latest_user", "latest_user", **o),
    "shrink_system": lambda **o: ShrinkPinned("shrink_system", "system", **o),
}
DEFAULT_PIPELINE = (
    "clear_tool_results",
    "drop_oldest_turns",
    "shrink_tool_results",
    "shrink_messages",
    "drop_recent_turns",
    "shrink_latest_user",
)


def build_pipeline(
    names: Iterable[str], options: Mapping[str, Mapping[str, Any]] | None = None
) -> tuple[Strategy, ...]:
    """Strategies by name, in order, each with its options. Raises ValueError naming the known
    strategies for an unknown name, and the strategy for a bad option."""
    options = options or {}
    pipeline = []
    for name in names:
        factory = STRATEGIES.get(name)
        if factory is None:
            raise ValueError(f"unknown strategy {name!r}; known: {', '.join(STRATEGIES)}")
        try:
            pipeline.append(factory(**dict(options.get(name) or {})))
        except TypeError as exc:
            raise ValueError(f"strategy {name!r}: {exc}") from None
    return tuple(pipeline)
