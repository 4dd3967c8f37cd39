"""Splits a conversation into what may be cut and what may not, by its messages' roles as counting
and trimming see them (which are pinned, never cut; which are tool results; which user message is
the latest: `proxy.core.trimming.budget`, which decides from them alone that a request fits), and
where its history is cut (`HistoryCut`, there too: it is part of what a trim returns).

- **Pinned**: system and developer messages, wherever they stand. Never dropped.
- **Protected**: the latest user message and everything after it (an agent's tool loop still in
  progress), also as units (`Conversation.tail`). The latest user message is never dropped, and
  only a last-resort strategy may shorten it; the tool exchanges after it may be cleared or dropped
  whole, the newest kept (`proxy.core.trimming.clearing`).
- **Compaction flags**: where a client compacted its history itself. A *marker* (Anthropic's
  `compaction` block, the Responses `compaction` item) is where the provider starts reading the
  conversation: the adapter leaves out of the view what precedes it (the provider drops it) and
  puts the marker in as a pinned message flagged `MARKER` (true), which no strategy shortens. A
  *trigger* (Codex's `compaction_trigger` item, the synthetic end of a `/v1/responses/compact`
  request) is a view message flagged `TRIGGER`: its request is a compaction request whatever its
  text (`proxy.core.trimming.clearing`). The flags are booleans, which the count does not read.
- **History**: everything else, as *turns* in order. A turn starts at a user message and runs to
  the next one (history that opens with an assistant message forms a turn of its own). Inside a
  turn, an assistant message with `tool_calls` (or a legacy `function_call`) and all of its
  results form one atomic *unit*: kept or dropped whole.

Dropping whole turns, oldest first, keeps the history starting on a user turn and never leaves a
`tool` message without its call or a call without its results.

**Cache-stable cut points**: where a conversation's history is cut, chosen so that the cut does not
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.trimming.budget import PINNED_ROLES, TOOL_RESULT_ROLES, latest_user_index

MARKER = "context_guard_compaction_marker"
TRIGGER = "context_guard_compaction_trigger"


def is_flagged(message: object, flag: str) -> bool:
    """Whether a view message carries `flag` (`MARKER`, `TRIGGER`)."""
    return isinstance(message, Mapping) and message.get(flag) is True


@dataclass(frozen=True, slots=True)
class Unit:
    indices: tuple[int, ...]
    is_tool_exchange: bool


@dataclass(frozen=True, slots=True)
class Turn:
    units: tuple[Unit, ...]

    @property
    def indices(self) -> tuple[int, ...]:
        return tuple(i for unit in self.units for i in unit.indices)


@dataclass(frozen=True, slots=True)
class Conversation:
    pinned: tuple[int, ...]
    protected: tuple[int, ...]
    turns: tuple[Turn, ...]  # oldest first
    tail: tuple[Unit, ...] = ()  # the protected messages as units: the latest prompt, the exchanges after it

    @property
    def history(self) -> tuple[int, ...]:
        return tuple(i for turn in self.turns for i in turn.indices)


def call_ids(message: Mapping[str, Any]) -> tuple[str, ...]:
    calls = message.get("tool_calls")
    ids = (
        [c["id"] for c in calls if isinstance(c, Mapping) and isinstance(c.get("id"), str)]
        if isinstance(calls, list)
        else []
    )
    return tuple(ids)


def is_tool_call(message: Mapping[str, Any]) -> bool:
    return message.get("role") == "assistant" and (
        bool(message.get("tool_calls")) or bool(message.get("function_call"))
    )


def split_conversation(messages: Sequence[Any]) -> Conversation:
    roles = [m.get("role") if isinstance(m, Mapping) else None for m in messages]
    pinned = tuple(i for i, role in enumerate(roles) if role in PINNED_ROLES)
    units = _units(messages, roles)
    latest = latest_user_index(messages)
    if latest is None:
        # No user message: protect the last message that is not pinned, and what follows it.
        latest = next((i for i in range(len(messages) - 1, -1, -1) if roles[i] not in PINNED_ROLES), len(messages))
    boundary = latest
    for unit in units:
        # A call whose results reach past the latest user message is part of the protected tail.
        if unit.indices[0] < boundary <= unit.indices[-1]:
            boundary = unit.indices[0]
    pinned_set = set(pinned)
    protected = tuple(i for i in range(boundary, len(messages)) if i not in pinned_set)
    turns: list[list[Unit]] = []
    tail: list[Unit] = []
    for unit in units:
        if unit.indices[0] >= boundary:
            tail.append(unit)
            continue
        first = unit.indices[0]
        if roles[first] == "user" or not turns:
            turns.append([])
        turns[-1].append(unit)
    return Conversation(pinned, protected, tuple(Turn(tuple(t)) for t in turns), tuple(tail))


def _units(messages: Sequence[Any], roles: Sequence[object]) -> list[Unit]:
    """Non-pinned messages in order, each tool call grouped with its results."""
    units: list[Unit] = []
    open_calls: dict[str, int] = {}  # call id -> position in `units`
    last_call_unit: int | None = None
    members: list[list[int]] = []
    exchange: list[bool] = []
    for i, message in enumerate(messages):
        role = roles[i]
        if role in PINNED_ROLES:
            continue
        if role in TOOL_RESULT_ROLES and isinstance(message, Mapping):
            call_id = message.get("tool_call_id")
            owner = open_calls.get(call_id) if isinstance(call_id, str) else None
            if owner is None:
                owner = last_call_unit if last_call_unit is not None else (len(members) - 1 if members else None)
            if owner is not None:
                members[owner].append(i)
                continue
        members.append([i])
        exchange.append(False)
        if isinstance(message, Mapping) and is_tool_call(message):
            exchange[-1] = True
            last_call_unit = len(members) - 1
            for call_id in call_ids(message):
                open_calls[call_id] = last_call_unit
        elif role not in TOOL_RESULT_ROLES:
            last_call_unit = None
    for unit_members, is_exchange in zip(members, exchange, strict=True):
        units.append(Unit(tuple(sorted(unit_members)), is_exchange))
    # Units must not interleave: merge any unit whose members overlap a later one's span.
    return _merge_interleaved(units)


def _merge_interleaved(units: list[Unit]) -> list[Unit]:
    merged: list[Unit] = []
    for unit in sorted(units, key=lambda u: u.indices[0]):
        if merged and unit.indices[0] < merged[-1].indices[-1]:
            last = merged.pop()
            unit = Unit(
                tuple(sorted(set(last.indices) | set(unit.indices))), last.is_tool_exchange or unit.is_tool_exchange
            )
        merged.append(unit)
    return merged


def validity_problems(messages: Sequence[Any]) -> list[str]:
    """What makes a message list invalid for a chat-completions API: orphaned tool results, calls
    without all their results, a history that does not start on a user turn after the pinned
    messages. Used to check that trimming never introduces a problem the input did not have."""
    problems: list[str] = []
    pending: dict[str, int] = {}
    seen_non_pinned = False
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            continue
        role = message.get("role")
        if role in PINNED_ROLES:
            continue
        if not seen_non_pinned:
            seen_non_pinned = True
            if role != "user":
                problems.append(f"messages[{i}]: history starts with {role!r}, not a user message")
        if role == "tool":
            call_id = message.get("tool_call_id")
            if call_id not in pending:
                problems.append(f"messages[{i}]: tool result {call_id!r} has no preceding call")
            else:
                del pending[call_id]
            continue
        if pending and role != "tool":
            problems.append(f"messages[{i}]: calls {sorted(pending)} have no results before this {role!r} message")
            pending.clear()
        if role == "assistant":
            pending.update(dict.fromkeys(call_ids(message), i))
    if pending:
        problems.append(f"calls {sorted(pending)} have no results")
    return problems


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
