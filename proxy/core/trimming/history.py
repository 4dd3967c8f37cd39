"""`drop_oldest_turns`: the history cut, shaped so that the provider's prompt cache stays warm; and
the middle-out shortening that keeps a turn, a message or a text in part.

A trimmed request keeps two stable stretches of its history and drops the middle:

- **the opening** (`head_share` of the input budget): the first turns of the conversation, the
  turn that straddles the end of that share kept in part. It follows from the opening turns and
  the budget alone, so it is the same on every later request of the conversation, and together
  with the system prompt it is a prefix that every trimmed request shares with the one before,
  even the request on which the cut moves. Where the opening is, the conversation's task usually
  is; models also read the start and the end of a long context best.
- **the recent turns**, after a cut on a cache-stable position (`proxy.core.trimming.turns`), multiples of
  `(1 - low_water) x input budget` tokens after the opening: the requests that follow append to an
  unchanged prefix until the budget is full again, then the cut moves on by a step.

When the recent turns the history guarantee keeps (at least half of the oldest of them) leave no
room for the whole opening, the opening gives way a tenth of the budget at a time until they fit:
it is then one of a few sizes, stable while the recent turns stay large; at worst it goes. The cut
may fall inside the oldest turn the guarantee keeps, which is then kept in part.

The opening's share and the step are shares of what the messages may hold beside the budget note
and a summary, when those are asked for.

**Middle-out shortening** of one text (and of one message of a request being trimmed) to a token
target keeps its head and its tail. The cut is marked in place with a plain statement of fact, `[...
1,234 tokens removed ...]`, worded so that it cannot read as an instruction to the model. Only the
kept head and tail are recounted, a few times at most, so shortening a very long text costs little
more than counting what is kept.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.trimming.budget import CutReason, HistoryCut
from proxy.core.trimming.trim import TrimState
from proxy.core.trimming.turns import MARKER, Turn, Unit, cut_point, is_flagged


@dataclass(frozen=True, slots=True)
class _Opening:
    whole: int  # opening turns kept whole
    partial_target: int  # tokens the straddling turn keeps; 0 when none straddles


@dataclass(frozen=True)
class DropOldestTurns:
    """Drop whole turns, oldest first, after the opening (`head_share` of the input budget, see
    the module docstring). The most recent `min_history_turns` turns, and as many more as it
    takes to keep `min_history_tokens` of history, are kept (the history guarantee).

    With `low_water` below 1, the cut falls on a cut position, a multiple of `(1 - low_water) x
    input budget` tokens after the opening: the next requests of the conversation append to the
    same prefix until the budget is full again. At 1, the cut is no deeper than needed. With
    `keep_partial`, the turn that straddles the cut (and the one that straddles the end of the
    opening) is kept in part: its largest message is shortened middle-out, with a marker, when
    that leaves it at least `min_partial_tokens`. When the cut position falls inside the history
    guarantee, turns go one by one, no deeper than needed (`HistoryCut.reason` "minimal")."""

    min_history_turns: int = 1
    min_history_tokens: int = 0
    low_water: float = 0.8
    keep_partial: bool = True
    min_partial_tokens: int = 64
    head_share: float = 0.75
    name: str = "drop_oldest_turns"

    def __post_init__(self) -> None:
        check_at_least(self.name, "min_history_turns", self.min_history_turns, 0)
        check_at_least(self.name, "min_history_tokens", self.min_history_tokens, 0)
        check_at_least(self.name, "min_partial_tokens", self.min_partial_tokens, 1)
        _check_share(self.name, "low_water", self.low_water, 0.1, 1)
        _check_share(self.name, "head_share", self.head_share, 0, 0.8)
        if not isinstance(self.keep_partial, bool):
            raise ValueError(f"{self.name}: keep_partial must be true or false, not {self.keep_partial!r}")

    def __call__(self, state: TrimState) -> None:
        turns = state.conversation.turns
        droppable = len(unguaranteed(state, self.min_history_turns, self.min_history_tokens))
        superseded = superseded_turns(state, turns[:droppable])
        if superseded:  # what a compaction marker stands for goes first, before any opening is kept
            drop_groups(state, superseded, self.name)
            if state.over() <= 0:
                return
            turns, droppable = turns[len(superseded) :], droppable - len(superseded)
        tokens = [sum(state.counts[i] for i in turn.indices) for turn in turns]
        budget = state.input_budget() - state.reserve  # what the messages may hold beside a note or summary
        room = sum(tokens) - state.over()  # history tokens that may stay
        opening = self._opening(tokens, droppable, room, int(self.head_share * budget), max(1, budget // 10))
        head_partial = None
        if opening.partial_target and self.keep_partial:
            turn = turns[opening.whole]
            head_partial = keep_in_part(state, turn, opening.partial_target, self.min_partial_tokens, self.name)
        head_tokens = sum(tokens[: opening.whole]) + (opening.partial_target if head_partial is not None else 0)
        # A turn across the opening's end that cannot be kept in part is the first turn after it.
        kept_opening = opening.whole + (1 if head_partial is not None else 0)
        if kept_opening:
            state.opening_end = turns[kept_opening - 1].indices[-1]
        if opening.partial_target:
            tokens[opening.whole] = sum(state.counts[i] for i in turns[opening.whole].indices)
        tail, tail_tokens = turns[kept_opening:], tokens[kept_opening:]
        tail_droppable = droppable - kept_opening
        step = 1 if self.low_water >= 1 else max(1, int((1 - self.low_water) * budget))
        reason: CutReason = "low_water" if step > 1 else "minimal"
        point = cut_point(tail_tokens, room - head_tokens, step, tail_droppable) if state.over() > 0 else None
        inside_guarantee = point is not None and point.straddling >= tail_droppable and point.partial_tokens > 0
        if inside_guarantee and not (self.keep_partial and point and point.partial_tokens >= self.min_partial_tokens):
            point = None  # inside the oldest turn the history guarantee keeps: kept in part, or no cut
        partial: int | None = None
        if point is None and state.over() > 0:  # the cut position lies inside the history guarantee
            drop_groups(state, tail[:tail_droppable], self.name)
            gone = sum(1 for turn in tail[:tail_droppable] if turn.indices[0] in state.dropped)
            reason, position, step, dropped_turns = "minimal", sum(tail_tokens[:gone]), 1, gone
        elif point is None:  # the opening's straddling turn made the room
            position, dropped_turns = 0, 0
        else:
            for turn in tail[: point.straddling]:
                for index in turn.indices:
                    state.drop(index, self.name)
            position, dropped_turns = point.position, point.straddling
            if point.partial_tokens and point.straddling >= tail_droppable:
                turn = tail[point.straddling]
                partial = keep_in_part(state, turn, point.partial_tokens, self.min_partial_tokens, self.name)
                if partial is None:  # it could not be cut there: what is left to cut, later strategies cut
                    reason = "minimal"
            elif point.partial_tokens:
                partial = self._keep_in_part(state, tail[point.straddling], point.partial_tokens)
                dropped_turns += 1 if partial is None else 0
        if not (dropped_turns or partial is not None or head_partial is not None):
            return
        first = dropped_turns - (1 if partial is not None else 0)
        state.cut = HistoryCut(
            reason=reason,
            position=position,
            step=step,
            dropped_turns=dropped_turns,
            first_kept=tail[first].indices[0] if first < len(tail) else None,
            partial_index=partial,
            partial_tokens=point.partial_tokens if point is not None and partial is not None else 0,
            head_tokens=head_tokens,
            head_turns=kept_opening,
            head_partial_index=head_partial,
        )

    def _opening(self, tokens: Sequence[int], droppable: int, room: int, share: int, quantum: int) -> _Opening:
        """The opening to keep: `share` tokens of the first droppable turns, less as many times
        `quantum` as it takes for the turns the history guarantee keeps to fit `room` beside it."""
        guaranteed = sum(tokens[droppable + 1 :]) + sum(tokens[droppable : droppable + 1]) // 2
        size = share
        while size >= self.min_partial_tokens and size + guaranteed > room:
            size -= quantum
        if size < self.min_partial_tokens:
            return _Opening(0, 0)
        total, whole = 0, 0
        while whole < droppable and total + tokens[whole] <= size:
            total += tokens[whole]
            whole += 1
        if whole >= droppable - 1 or size - total < self.min_partial_tokens or not self.keep_partial:
            # No turn straddles the end (or it is the last one that may go): whole turns only.
            return _Opening(whole, 0)
        return _Opening(whole, size - total)

    def _keep_in_part(self, state: TrimState, turn: Turn, target: int) -> int | None:
        """Shorten the largest message of `turn` that has text, so that the turn holds at most
        `target` tokens; returns its index, or None (and the turn is dropped) when that would
        leave it under `min_partial_tokens` or cannot be done."""
        index = None
        if self.keep_partial and target >= self.min_partial_tokens:
            index = keep_in_part(state, turn, target, self.min_partial_tokens, self.name)
        if index is None:
            for i in turn.indices:
                state.drop(i, self.name)
        return index


def keep_in_part(state: TrimState, turn: Turn, target: int, min_tokens: int, strategy: str) -> int | None:
    """Shorten the largest message of `turn` that has text, so that the turn holds at most
    `target` tokens; returns its index, or None when that would leave it under `min_tokens`. When
    the text alone cannot make the room, the turn's images are first replaced by a marker."""
    texts = [i for i in turn.indices if has_text(state.messages[i])]
    excess = sum(state.counts[i] for i in turn.indices) - target
    if not texts or excess <= 0:
        return None
    before = state.snapshot(turn.indices)  # an attempt that falls short leaves the turn as it was
    index = min(texts, key=lambda i: (-state.counts[i], i))
    if state.counts[index] - excess < min_tokens:
        with_images = [i for i in turn.indices if _has_image(state.messages[i])]
        without = {i: without_images(state.messages[i]) for i in with_images}
        saved = sum(state.counts[i] - state.counter.message(m, i).tokens for i, (m, _) in without.items())
        if not saved or state.counts[index] - (excess - saved) < min_tokens:
            return None
        for i, (message, removed) in without.items():
            state.replace(i, message, "image_dropped", strategy, removed)
        excess -= saved
        index = min(texts, key=lambda i: (-state.counts[i], i))
    if excess > 0:
        shorten_message(state, index, state.counts[index] - excess, strategy)
    if sum(state.counts[i] for i in turn.indices) > target:
        state.restore(before)
        return None
    return index


def _has_image(message: object) -> bool:
    content = message.get("content") if isinstance(message, Mapping) else None
    return isinstance(content, list) and any(is_image(p) for p in content)


def unguaranteed(state: TrimState, min_turns: int, min_tokens: int) -> tuple[Turn, ...]:
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


def superseded_turns(state: TrimState, turns: Sequence[Turn]) -> tuple[Turn, ...]:
    """The leading `turns` that end before the newest compaction marker (`MARKER`): the history the
    marker stands for, which a client may still send (the Responses API reads every item sent)."""
    flagged = [i for i in state.conversation.pinned if is_flagged(state.messages[i], MARKER)]
    if not flagged:
        return ()
    marker = max(flagged)
    return tuple(itertools.takewhile(lambda turn: turn.indices[-1] < marker, turns))


def drop_groups(state: TrimState, groups: Iterable[Turn | Unit], strategy: str) -> None:
    """Drop whole turns or units, in order, until the request fits."""
    for group in groups:
        if state.over() <= 0:
            return
        for index in group.indices:
            state.drop(index, strategy)


def check_at_least(strategy: str, option: str, value: object, least: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{strategy}: {option} must be a whole number of at least {least}, not {value!r}")


def _check_share(strategy: str, option: str, value: object, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{strategy}: {option} must be a number, not {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{strategy}: {option} must be between {low:g} and {high:g}, not {value!r}")


IMAGE_MARKER = "[image removed]"
HEAD_SHARE = 0.6  # the opening of a document or log usually says more than its end, but not all


def marker(removed_tokens: int) -> str:
    return f"[... {removed_tokens:,} tokens removed ...]"


@dataclass(frozen=True, slots=True)
class Shortened:
    text: str
    tokens: int  # tokens of the new text
    removed: int  # tokens of the original text that are gone


def shorten_middle(text: str, tokens: int, target: int, count: Callable[[str], int]) -> Shortened | None:
    """`text` (of `tokens` tokens) cut in the middle to at most `target` tokens, marker included.

    Returns None when the text already fits, or when not even the marker fits in `target`.
    """
    if tokens <= target:
        return None
    marker_cost = count(marker(tokens)) + 2  # and the newlines around it
    room = target - marker_cost
    if room < 0:
        return None
    chars_per_token = len(text) / max(tokens, 1)
    keep_chars = int(room * chars_per_token)
    for _ in range(12):
        head_chars = int(keep_chars * HEAD_SHARE)
        tail_chars = keep_chars - head_chars
        head = text[:head_chars]
        tail = text[len(text) - tail_chars :] if tail_chars else ""
        kept = count(head) + count(tail)
        removed = max(tokens - kept, 1)
        candidate = f"{head}\n{marker(removed)}\n{tail}" if keep_chars else marker(tokens)
        new_tokens = count(candidate)
        if new_tokens <= target:
            return Shortened(candidate, new_tokens, tokens - kept if keep_chars else tokens)
        if keep_chars == 0:
            return None
        # Shrink in proportion to the overshoot, and by at least a tenth, so the loop ends fast.
        keep_chars = min(int(keep_chars * target / new_tokens), int(keep_chars * 0.9))
    final = marker(tokens)
    n = count(final)
    return Shortened(final, n, tokens) if n <= target else None


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


def has_text(message: object) -> bool:
    """Whether `message` holds text that `shorten_message` can cut."""
    if not isinstance(message, Mapping):
        return False
    content = message.get("content")
    return isinstance(content, str) or (isinstance(content, list) and any(_is_text(p) for p in content))


def _is_text(part: object) -> bool:
    return isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)


def is_image(part: object) -> bool:
    return isinstance(part, Mapping) and part.get("type") == "image_url"


def without_images(message: Mapping[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """`message` with each image part replaced by a text marker, and the parts removed."""
    content = message.get("content")
    parts = content if isinstance(content, list) else []
    new_content = [{"type": "text", "text": IMAGE_MARKER} if is_image(p) else p for p in parts]
    return {**message, "content": new_content}, [p for p in parts if is_image(p)]
