"""The trimming strategies, each a small object configured once and called per request.

Every strategy acts only while the request is over budget, and stops as soon as it fits. In the
default order they drop the oldest history first, then shorten oversized content, and touch the
latest user message only as a last resort:

    drop_images          replace the oldest images with a short marker (opt-in: list it first)
    clamp_max_tokens     lower the request's own max_tokens, never below a floor (opt-in)
    drop_old_tool_exchanges  drop old tool calls with their results before whole turns (opt-in)
    drop_oldest_turns    drop whole turns, oldest first, keeping the history guarantee; by default
                         down to a cache-stable cut position (see `proxy.core.cuts`), keeping
                         the turn that straddles it in part
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

from proxy.core.budget import requested_output
from proxy.core.cuts import CutReason, HistoryCut, cut_point
from proxy.core.shrink import shorten_middle
from proxy.core.trim import Strategy, TrimState
from proxy.core.turns import Turn, Unit

IMAGE_MARKER = "[image removed]"


@dataclass(frozen=True)
class DropOldestTurns:
    """Drop whole turns, oldest first. The most recent `min_history_turns` turns, and as many more
    as it takes to keep `min_history_tokens` of history, are kept (the history guarantee).

    With `low_water` below 1, the cut falls on a cut position, a multiple of `(1 - low_water) x
    input budget` tokens of history from its start: a cut request keeps between about `low_water`
    and all of its history room, and the next requests of the conversation append to the same
    prefix (the provider's prompt cache stays warm) until the room is full again. At 1, the cut is
    no deeper than needed. With `keep_partial`, the turn that straddles the cut is kept in part:
    its largest message is shortened middle-out, with a marker, to the tokens after the cut, when
    that leaves it at least `min_partial_tokens`. When the cut position falls inside the history
    guarantee, turns go one by one, no deeper than needed (`HistoryCut.reason` "minimal")."""

    min_history_turns: int = 1
    min_history_tokens: int = 0
    low_water: float = 0.7
    keep_partial: bool = True
    min_partial_tokens: int = 64
    head_share: float = 0.0
    name: str = "drop_oldest_turns"

    def __post_init__(self) -> None:
        _check_at_least(self.name, "min_history_turns", self.min_history_turns, 0)
        _check_at_least(self.name, "min_history_tokens", self.min_history_tokens, 0)
        _check_at_least(self.name, "min_partial_tokens", self.min_partial_tokens, 1)
        if isinstance(self.low_water, bool) or not isinstance(self.low_water, int | float):
            raise ValueError(f"{self.name}: low_water must be a number, not {self.low_water!r}")
        if not 0.1 <= self.low_water <= 1:
            raise ValueError(f"{self.name}: low_water must be between 0.1 and 1, not {self.low_water!r}")
        if isinstance(self.head_share, bool) or not isinstance(self.head_share, int | float):
            raise ValueError(f"{self.name}: head_share must be a number, not {self.head_share!r}")
        if not 0 <= self.head_share <= 0.5:
            raise ValueError(f"{self.name}: head_share must be between 0 and 0.5, not {self.head_share!r}")
        if not isinstance(self.keep_partial, bool):
            raise ValueError(f"{self.name}: keep_partial must be true or false, not {self.keep_partial!r}")

    def __call__(self, state: TrimState) -> None:
        turns = state.conversation.turns
        droppable = len(_unguaranteed(state, self.min_history_turns, self.min_history_tokens))
        tokens = [sum(state.counts[i] for i in turn.indices) for turn in turns]
        head = _head(tokens, int(self.head_share * state.input_budget()), droppable)
        turns, tokens, droppable = turns[head:], tokens[head:], droppable - head
        step = 1 if self.low_water >= 1 else max(1, int((1 - self.low_water) * state.input_budget()))
        point = cut_point(tokens, sum(tokens) - state.over(), step, droppable)
        if point is None:  # the cut position lies inside the history guarantee
            dropped_before = len(state.dropped)
            _drop_groups(state, turns[:droppable], self.name)
            gone = sum(1 for turn in turns[:droppable] if turn.indices[0] in state.dropped)
            if len(state.dropped) > dropped_before:
                position = sum(tokens[:gone])
                state.cut = _history_cut("minimal", position, 1, turns, gone, None, 0)
            return
        if point.position == 0:
            return
        for turn in turns[: point.straddling]:
            for index in turn.indices:
                state.drop(index, self.name)
        partial: int | None = None
        if point.partial_tokens:
            turn = turns[point.straddling]
            if self.keep_partial and point.partial_tokens >= self.min_partial_tokens:
                partial = _keep_in_part(state, turn, point.partial_tokens, self.min_partial_tokens, self.name)
            if partial is None:
                for index in turn.indices:
                    state.drop(index, self.name)
        reason: CutReason = "low_water" if step > 1 else "minimal"
        dropped_turns = point.straddling + (1 if point.partial_tokens and partial is None else 0)
        kept_tokens = point.partial_tokens if partial is not None else 0
        state.cut = _history_cut(reason, point.position, step, turns, dropped_turns, partial, kept_tokens)


def _head(tokens: Sequence[int], head_tokens: int, droppable: int) -> int:
    """How many of the opening turns fit in `head_tokens` (and may be dropped at all)."""
    total = 0
    for index, turn_tokens in enumerate(tokens[:droppable]):
        total += turn_tokens
        if total > head_tokens:
            return index
    return droppable


def _history_cut(
    reason: CutReason,
    position: int,
    step: int,
    turns: Sequence[Turn],
    dropped_turns: int,
    partial: int | None,
    partial_tokens: int,
) -> HistoryCut:
    first = dropped_turns - (1 if partial is not None else 0)
    first_kept = turns[first].indices[0] if first < len(turns) else None
    return HistoryCut(reason, position, step, dropped_turns, first_kept, partial, partial_tokens)


def _keep_in_part(state: TrimState, turn: Turn, target: int, min_tokens: int, strategy: str) -> int | None:
    """Shorten the largest message of `turn` that has text, so that the turn holds at most
    `target` tokens; returns its index, or None when that would leave it under `min_tokens`."""
    texts = [i for i in turn.indices if _has_text(state.messages[i])]
    if not texts:
        return None
    index = min(texts, key=lambda i: (-state.counts[i], i))
    excess = sum(state.counts[i] for i in turn.indices) - target
    if state.counts[index] - excess < min_tokens:
        return None
    shorten_message(state, index, state.counts[index] - excess, strategy)
    if sum(state.counts[i] for i in turn.indices) > target:
        return None
    return index


def _has_text(message: object) -> bool:
    if not isinstance(message, Mapping):
        return False
    content = message.get("content")
    return isinstance(content, str) or (isinstance(content, list) and any(_is_text(p) for p in content))


def _check_at_least(strategy: str, option: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{strategy}: {option} must be a whole number of at least {least}, not {value!r}")


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
        turns = _unguaranteed(state, self.min_history_turns, self.min_history_tokens)
        exchanges = (unit for turn in turns for unit in turn.units if unit.is_tool_exchange)
        _drop_groups(state, exchanges, self.name)


@dataclass(frozen=True)
class DropRecentTurns:
    """Drop the turns the history guarantee kept, oldest first: better a short history than a
    rejected request."""

    name: str = "drop_recent_turns"

    def __call__(self, state: TrimState) -> None:
        _drop_groups(state, state.conversation.turns, self.name)


def _unguaranteed(state: TrimState, min_turns: int, min_tokens: int) -> tuple[Turn, ...]:
    """The history turns outside the history guarantee, oldest first: the guarantee keeps the most
    recent `min_turns` turns, and as many more as it takes to keep `min_tokens` of history."""
    turns = state.conversation.turns
    kept, tokens = 0, 0
    for turn in reversed(turns):
        if kept >= min_turns and tokens >= min_tokens:
            break
        kept += 1
        tokens += sum(state.counts[i] for i in turn.indices)
    return turns[: len(turns) - kept]


def _drop_groups(state: TrimState, groups: Iterable[Turn | Unit], strategy: str) -> None:
    """Drop whole turns or units, in order, until the request fits."""
    for group in groups:
        if state.over() <= 0:
            return
        for index in group.indices:
            state.drop(index, strategy)


@dataclass(frozen=True)
class ShrinkContent:
    """Cut messages of the given roles that are over `cap` tokens, middle-out: each no further than
    the request needs, and never below `cap`. Roles are taken in `roles` order (the priority), and
    oldest first within a role; `caps` overrides `cap` per role. Pinned messages and the latest
    user message are never candidates; `include_protected` admits the tool results after it.
    A cap is never more than `cap_share` of the input budget, so that on a small window old
    messages are shortened before recent turns are dropped."""

    name: str
    roles: tuple[str, ...]
    cap: int = 2000
    caps: Mapping[str, int] = field(default_factory=dict)
    include_protected: bool = False
    cap_share: float = 0.25

    def __post_init__(self) -> None:
        _check_at_least(self.name, "cap", self.cap, 1)
        for role, cap in self.caps.items():
            _check_at_least(self.name, f"caps.{role}", cap, 1)
        if isinstance(self.cap_share, bool) or not isinstance(self.cap_share, int | float):
            raise ValueError(f"{self.name}: cap_share must be a number, not {self.cap_share!r}")
        if not 0 < self.cap_share <= 1:
            raise ValueError(f"{self.name}: cap_share must be in (0, 1], not {self.cap_share!r}")

    def __call__(self, state: TrimState) -> None:
        conversation = state.conversation
        allowed = set(conversation.history)
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
                target = max(cap, state.counts[index] - state.over())
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
        else:
            candidates = sorted(conversation.pinned, key=lambda i: -state.counts[i])
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
            if not isinstance(content, list) or not any(_is_image(p) for p in content):
                continue
            new_content = [{"type": "text", "text": IMAGE_MARKER} if _is_image(p) else p for p in content]
            removed = [p for p in content if _is_image(p)]
            state.replace(index, {**message, "content": new_content}, "image_dropped", self.name, removed)


@dataclass(frozen=True)
class ClampMaxTokens:
    """Lower the request's own `max_tokens` / `max_completion_tokens` to make room, never below
    `floor`. A request that sets neither is left to the other strategies."""

    floor: int = 1024
    name: str = "clamp_max_tokens"

    def __call__(self, state: TrimState) -> None:
        requested, key = requested_output(state.body)
        if requested is None or requested <= self.floor:
            return
        lowered = max(self.floor, requested - state.over())
        if lowered < requested:
            state.clamp_output(key, lowered, self.name)


def shorten_message(state: TrimState, index: int, target: int, strategy: str) -> None:
    """Shorten message `index` to about `target` tokens by cutting its text (a string content or
    its largest text parts) in the middle. Leaves it alone when it holds no text worth cutting."""
    message = state.messages[index]
    if not isinstance(message, Mapping):
        return
    counter = state.counter
    content = message.get("content")
    excess = state.counts[index] - target
    if isinstance(content, str):
        tokens = counter.text(content)
        cut = shorten_middle(content, tokens, max(0, tokens - excess), counter.text)
        if cut is not None:
            state.replace(index, {**message, "content": cut.text}, "truncated", strategy, content)
        return
    if not isinstance(content, list):
        return
    parts = list(content)
    texts = sorted(
        ((counter.text(p["text"]), j) for j, p in enumerate(parts) if _is_text(p)),
        reverse=True,
    )
    changed = False
    for tokens, j in texts:
        if excess <= 0:
            break
        cut = shorten_middle(parts[j]["text"], tokens, max(0, tokens - excess), counter.text)
        if cut is None:
            continue
        parts[j] = {**parts[j], "text": cut.text}
        excess -= tokens - cut.tokens
        changed = True
    if changed:
        state.replace(index, {**message, "content": parts}, "truncated", strategy, content)


def _role(message: object) -> str | None:
    role = message.get("role") if isinstance(message, Mapping) else None
    return role if isinstance(role, str) else None


def _is_image(part: object) -> bool:
    return isinstance(part, Mapping) and part.get("type") == "image_url"


def _is_text(part: object) -> bool:
    return isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)


def _shrink_tool_results(**options: Any) -> Strategy:
    return ShrinkContent("shrink_tool_results", ("tool", "function"), **{"include_protected": True, **options})


def _shrink_messages(**options: Any) -> Strategy:
    roles = tuple(options.pop("roles", ("assistant", "user")))
    return ShrinkContent("shrink_messages", roles, **options)


STRATEGIES: Mapping[str, Callable[..., Strategy]] = {
    "drop_images": DropImages,
    "clamp_max_tokens": ClampMaxTokens,
    "drop_old_tool_exchanges": DropOldToolExchanges,
    "drop_oldest_turns": DropOldestTurns,
    "shrink_tool_results": _shrink_tool_results,
    "shrink_messages": _shrink_messages,
    "drop_recent_turns": DropRecentTurns,
    "shrink_latest_user": lambda **o: ShrinkPinned("shrink_latest_user", "latest_user", **o),
    "shrink_system": lambda **o: ShrinkPinned("shrink_system", "system", **o),
}
DEFAULT_PIPELINE = (
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
