"""The trimming strategies, each a small object configured once and called per request.

Every strategy acts only while the request is over budget, and stops as soon as it fits. In the
default order they drop the oldest history first, then shorten oversized content, and touch the
latest user message only as a last resort:

    drop_images          replace the oldest images with a short marker (opt-in: list it first)
    clamp_max_tokens     lower the request's own max_tokens, never below a floor (opt-in)
    drop_old_tool_exchanges  drop old tool calls with their results before whole turns (opt-in)
    drop_oldest_turns    drop whole turns, oldest first, keeping the history guarantee
    shrink_tool_results  cut oversized tool results to their cap, middle-out, oldest first
    shrink_messages      the same for long older user and assistant messages
    drop_recent_turns    drop the turns the history guarantee kept, once shrinking could not help
    shrink_latest_user   middle-out cut of the latest user message (last resort)
    shrink_system        middle-out cut of the system prompt (opt-in: list it to allow it)

`STRATEGIES` is the registry the settings loader builds them from; an unknown name is an error
that lists the known ones.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.core.budget import requested_output
from proxy.core.shrink import shorten_middle
from proxy.core.trim import Strategy, TrimState
from proxy.core.turns import Turn, Unit

IMAGE_MARKER = "[image removed]"


@dataclass(frozen=True)
class DropOldestTurns:
    """Drop whole turns, oldest first. The most recent `min_history_turns` turns, and as many more
    as it takes to keep `min_history_tokens` of history, are kept (the history guarantee)."""

    min_history_turns: int = 1
    min_history_tokens: int = 0
    name: str = "drop_oldest_turns"

    def __call__(self, state: TrimState) -> None:
        _drop_groups(state, _unguaranteed(state, self.min_history_turns, self.min_history_tokens), self.name)


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
    user message are never candidates; `include_protected` admits the tool results after it."""

    name: str
    roles: tuple[str, ...]
    cap: int = 2000
    caps: Mapping[str, int] = field(default_factory=dict)
    include_protected: bool = False

    def __call__(self, state: TrimState) -> None:
        conversation = state.conversation
        allowed = set(conversation.history)
        if self.include_protected:
            allowed |= set(conversation.protected)
        for role in self.roles:
            cap = self.caps.get(role, self.cap)
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
