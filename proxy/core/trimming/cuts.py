"""Cache-stable cut points: where a conversation's history is cut, chosen so that the cut does not
move when the client appends a turn and re-sends the conversation.

Providers cache prompts by prefix (OpenAI bills cached input at a fraction, Anthropic reads cache
at a tenth, vLLM and llama.cpp reuse the prefix's KV cache). A trimmer that removes just enough
moves its cut with every new turn, so every request starts with a different oldest message and
misses the cache after the system prompt. Here the cut instead falls on a *cut position*: a
multiple of `step` tokens of history, counted from the history's start. The cut is the first
position after which the rest of the history fits its room. Appending a turn moves neither the
positions (they are counted from the start, which does not change) nor the cut, until the history
outgrows its room again and the cut moves on by one or more steps. A replica that sees only the
newest request computes the same cut from the request alone: no state is shared.

With `step = (1 - low_water) x input budget`, a request that had to be cut keeps between about
`low_water` and all of its history room, and the requests that follow append to an unchanged
prefix until the room is full again.

The turn that straddles the cut position is kept in part, so that the history starts exactly at
the position and no room below it is left empty: `CutPoint.partial_tokens` is what remains of it.
That turn may be the oldest one the history guarantee keeps: the guarantee then holds it in part,
and the cut stays on its position instead of falling back to a cut that moves with every turn.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from proxy.core.record_fields import field_dict


@dataclass(frozen=True, slots=True)
class CutPoint:
    position: int  # history tokens before the cut, counted from the history's start
    straddling: int  # the turn the position falls in (or the first turn kept whole, when it falls between)
    partial_tokens: int  # tokens of the straddling turn after the position; 0 when it falls between turns

    @property
    def first_whole(self) -> int:
        """The first turn kept whole."""
        return self.straddling + 1 if self.partial_tokens else self.straddling


def cut_point(turn_tokens: Sequence[int], room: int, step: int, droppable: int) -> CutPoint | None:
    """Where to cut a history of turns of `turn_tokens` tokens (oldest first) so that what follows
    fits `room`, on a multiple of `step`. Only the first `droppable` turns may be dropped; the
    position may also fall inside the turn after them (the oldest one the history guarantee
    keeps), which is then kept in part. None when no cut position within them leaves a history
    that fits."""
    if step < 1:
        raise ValueError("step must be at least 1 token")
    total = sum(turn_tokens)
    if total <= room:
        return CutPoint(0, 0, 0)
    # Past the end, every cut is the same: the whole history goes.
    position = min(total, math.ceil((total - room) / step) * step)
    start = 0
    for index, tokens in enumerate(turn_tokens):
        end = start + tokens
        if start >= position:
            return CutPoint(position, index, 0)
        if end > position:
            return CutPoint(position, index, end - position) if index <= droppable else None
        if index >= droppable:
            return None  # the position lies past a turn the history guarantee keeps
        start = end
    return CutPoint(position, len(turn_tokens), 0) if len(turn_tokens) <= droppable else None


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
        return field_dict(self)
