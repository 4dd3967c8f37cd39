"""`clear_tool_results`: an agent's old tool output cleared in place, in cache-stable blocks.

An agent loop is one user prompt followed by many tool calls and their results, and the results
weigh most and matter least once the model has read them. So, before any turn is dropped:

1. **Clear** old tool results, oldest first: the call stays, the result's content becomes a short
   placeholder that says what was removed and that calling the tool again returns it. The newest
   `keep_last` results are never cleared.
2. **Drop** old tool exchanges whole (a call with all its results, and the reasoning or thinking
   that precedes it, one atomic unit), oldest first, when clearing every old result was not
   enough. The exchanges holding the newest `keep_last` results stay.

User messages (the turn's opening prompt above all), assistant messages without calls and the
system prompt are never touched here.

**Cache-stable by construction.** Results are cleared in blocks, and a cleared result stays
cleared: the request is replayed as the conversation was sent, one request after each tool
result, from the start. Each replayed request keeps what the one before it cleared; one that is
over its budget clears the oldest results (the newest `keep_last` excepted) until it is `step`
under it (`step_share` of the input budget, and at least `clear_at_least` tokens). So the
requests that follow a clearing append to an unchanged prefix until the budget is full again,
and the next clearing frees a block at once; a result is never cleared before a request needs
its room, and once cleared it is the same placeholder bytes on every later request (its words
follow from the result and its call alone). It follows from the request alone: any replica
computes the same, with no state shared.

**A client's compaction request** (its latest user message asks to summarise the conversation,
or it ends in a compaction trigger, `proxy.core.trimming.turns.TRIGGER`) is the one request
that needs the whole history: clearing would leave the summary without material. Its tool results
are instead all shortened middle-out to one common cap, the largest that fits (the placeholder
only below `compaction_floor` tokens each), and later strategies may not drop its opening
(`TrimState.compaction_request`).

Agent clients compact their history themselves when it grows too long: they send the whole
conversation once more with an instruction to summarise it, and replace the history with the
answer (`is_compaction_request`). The prompts recognised:

- Claude Code: "Your task is to create a detailed summary of the conversation so far ...", and (2.1)
  "... of this conversation. This summary will be placed at the start of a continuing session"
  and, for a partial compaction, "... of the RECENT portion of the conversation"
- Codex CLI: "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary for
  another LLM that will resume the task." (and its older "write a summary/memento ... for the next
  agent" family)
- gemini-cli: its latest user message asks to "generate the <state_snapshot>" (the instruction
  itself goes as the system instruction)
- generic: "summarize (or summarise) the/this/our conversation (so far)", "compact the conversation"

and any regular expression the operator adds (`clear_tool_results.compaction_patterns`). Matching
is case-insensitive, over the message's text, and only its first 4,000 characters are read: the
instruction is short and comes first, while the same words deep inside pasted material are not a
request to compact.

The chat view is the core's: each adapter maps its own units onto it (chat `tool` messages,
Responses `function_call_output` items, Anthropic `tool_result` blocks, Gemini function
responses), and writes the placeholder back as that unit's content.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from proxy.core.trimming.budget import TOOL_RESULT_ROLES
from proxy.core.trimming.history import shorten_message
from proxy.core.trimming.trim import TrimState
from proxy.core.trimming.turns import TRIGGER, Unit, is_flagged

BUILT_IN = (
    r"create a detailed summary of (?:the conversation so far|this conversation|the recent portion of the conv)",
    r"context checkpoint compaction",
    r"create a handoff summary for another llm",
    r"\bsummari[sz]e (?:the|this|our) (?:entire |whole )?(?:conversation|chat|session)\b",
    r"\bcompact (?:the|this|our) (?:conversation|chat|session|context)\b",
    r"\b(?:summary|memento)\b[^.]{0,80}\bfor the next agent\b",
    r"generate the <state_snapshot>",
)
READ_CHARS = 4000


@lru_cache(maxsize=64)
def compiled_patterns(extra: tuple[str, ...] = ()) -> re.Pattern[str]:
    """The built-in prompts and `extra` as one expression; ValueError naming a bad one."""
    for pattern in extra:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"compaction pattern {pattern!r} is not a regular expression: {exc}") from None
    return re.compile("|".join(f"(?:{p})" for p in (*BUILT_IN, *extra)), re.IGNORECASE)


def is_compaction_request(messages: Sequence[Any], protected: Iterable[int], extra: tuple[str, ...] = ()) -> bool:
    """Whether the latest user message (the first user message of the `protected` tail) asks
    to summarise the conversation, or the tail holds a compaction trigger."""
    latest = next((i for i in protected if _role(messages[i]) == "user"), None)
    if latest is None:
        return False
    if any(is_flagged(messages[i], TRIGGER) for i in protected):
        return True
    text = _text(messages[latest])[:READ_CHARS]
    return bool(text) and compiled_patterns(extra).search(text) is not None


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = (p.get("text") for p in content if isinstance(p, Mapping))
    return "\n".join(t for t in parts if isinstance(t, str))


def placeholder(tool: str | None, tokens: int) -> str:
    """What a cleared tool result reads: what was removed and how to get it back, in words that
    depend on the result alone, so that it is the same bytes on every later request."""
    what = f"the output of {tool}" if tool else "this tool output"
    return (
        f"[context-guard cleared {what} ({tokens:,} tokens) to fit the context window; "
        f"calling the tool again returns it]"
    )


@dataclass(frozen=True)
class ClearToolResults:
    """Clear old tool results in blocks of at least `step_share` of the input budget (and
    `clear_at_least` tokens), cache-stable, then drop old tool exchanges whole, keeping the newest
    `keep_last` results (see the module docstring); shorten a compaction request's tool results
    evenly instead. `compaction_patterns` adds the operator's own regular expressions to
    the compaction prompts recognised."""

    keep_last: int = 3
    step_share: float = 0.45
    clear_at_least: int = 1024
    drop_exchanges: bool = True
    compaction_floor: int = 64
    compaction_patterns: tuple[str, ...] = ()
    name: str = "clear_tool_results"

    def __post_init__(self) -> None:
        for option, least in (("keep_last", 0), ("clear_at_least", 1), ("compaction_floor", 16)):
            value = getattr(self, option)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{self.name}: {option} must be a whole number of at least {least}, not {value!r}")
        share = self.step_share
        if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
            raise ValueError(f"{self.name}: step_share must be a number in (0, 1], not {share!r}")
        if not isinstance(self.drop_exchanges, bool):
            raise ValueError(f"{self.name}: drop_exchanges must be true or false, not {self.drop_exchanges!r}")
        patterns = self.compaction_patterns
        if isinstance(patterns, str) or not all(isinstance(p, str) for p in patterns):
            raise ValueError(f"{self.name}: compaction_patterns must be a list of regular expressions")
        object.__setattr__(self, "compaction_patterns", tuple(patterns))
        try:
            compiled_patterns(self.compaction_patterns)  # a bad expression is an error now, naming it
        except ValueError as exc:
            raise ValueError(f"{self.name}: {exc}") from None

    def __call__(self, state: TrimState) -> None:
        results = tool_results(state)
        kept = results[len(results) - self.keep_last :] if self.keep_last else []
        old = results[: len(results) - len(kept)]
        if is_compaction_request(state.messages, state.conversation.protected, self.compaction_patterns):
            state.compaction_request = True
            self._shorten_evenly(state, results)
            return
        self._clear(state, results, len(old))
        if self.drop_exchanges and state.over() > 0:
            _drop_exchanges(state, set(kept), self.name)

    def _clear(self, state: TrimState, results: Sequence[int], old: int) -> None:
        """Clear the oldest of the first `old` `results`, as many as the conversation's replay
        says (`_replayed`)."""
        if state.over() <= 0 or not old:
            return
        cleared = _Clearing(self, state, results)
        count = self._replayed(state, results, old, cleared)
        for index in results[:count]:
            message, tokens = cleared.placeholder(index)
            if tokens < state.counts[index]:
                state.replace(index, message, "cleared", self.name, state.messages[index].get("content"))

    def _replayed(self, state: TrimState, results: Sequence[int], old: int, cleared: _Clearing) -> int:
        """How many of the oldest results to clear: the requests the conversation was sent as, one
        after each tool result, replayed from the start. Each request keeps what the one before it
        cleared; one that is over clears the oldest results the newest `keep_last` leave, until it
        is `step` under its budget. Every request of a conversation replays the same past, so a
        result once cleared stays cleared, and none is cleared before a request needs it."""
        budget = state.input_budget() - state.reserve
        step = max(self.clear_at_least, int(self.step_share * state.input_budget()))
        fixed = state.total - sum(state.counts)
        sent, position, count = fixed, 0, 0
        for j, index in enumerate(results):
            sent += sum(state.counts[position : index + 1])
            position = index + 1
            over = sent - cleared.saved(count) - budget
            if over > 0:
                count = cleared.advance(count, over + step, min(old, j + 1 - self.keep_last))
        over = state.total - cleared.saved(count) - budget
        return cleared.advance(count, over + step, old) if over > 0 else count

    def _shorten_evenly(self, state: TrimState, results: Sequence[int]) -> None:
        """Shorten every tool result to one common cap, the largest that makes the request fit; at
        `compaction_floor` and still over, clear the oldest results."""
        for _ in range(3):  # a shortened text lands near its target, not on it: a pass or two more
            over = state.over()
            if over <= 0:
                return
            live = [i for i in results if i not in state.dropped]
            cap = _water_level([state.counts[i] for i in live], over)
            if cap < self.compaction_floor:
                break
            for index in live:
                if state.counts[index] > cap:
                    shorten_message(state, index, cap, self.name)
        for index in results:
            if state.over() <= 0:
                return
            clear_result(state, index, self.name)


def cleared_result(state: TrimState, index: int) -> tuple[Mapping[str, object], int]:
    """Tool result `index` with its content replaced by the placeholder, and its tokens."""
    message = state.messages[index]
    content = placeholder(_tool_name(state, index), state.counts[index])
    new = {**message, "content": content}
    return new, state.counter.message(new, index).tokens


def clear_result(state: TrimState, index: int, strategy: str) -> None:
    """Replace tool result `index` with its placeholder, when that saves tokens."""
    message, tokens = cleared_result(state, index)
    if tokens < state.counts[index]:
        state.replace(index, message, "cleared", strategy, state.messages[index].get("content"))


class _Clearing:
    """The placeholders of a request's tool results, and the tokens clearing the oldest ones
    saves, worked out only as far as they are asked for."""

    def __init__(self, strategy: ClearToolResults, state: TrimState, results: Sequence[int]) -> None:
        self._strategy, self._state, self._results = strategy, state, results
        self._placeholders: dict[int, tuple[Mapping[str, object], int]] = {}
        self._saved = [0]  # tokens saved by clearing the first n results

    def placeholder(self, index: int) -> tuple[Mapping[str, object], int]:
        if index not in self._placeholders:
            self._placeholders[index] = cleared_result(self._state, index)
        return self._placeholders[index]

    def saved(self, count: int) -> int:
        while len(self._saved) <= count:
            index = self._results[len(self._saved) - 1]
            self._saved.append(self._saved[-1] + max(0, self._state.counts[index] - self.placeholder(index)[1]))
        return self._saved[count]

    def advance(self, count: int, tokens: int, limit: int) -> int:
        """`count` raised until clearing saves `tokens` more, or to `limit`."""
        start = self.saved(count)
        while count < limit and self.saved(count) - start < tokens:
            count += 1
        return count


def _water_level(sizes: Sequence[int], over: int) -> int:
    """The largest cap such that cutting every size above it down to it removes at least `over`
    (and a few tokens per cut for the marker that says so); 0 when no cap does."""
    low, high = 0, max(sizes, default=0)
    while low < high:
        cap = (low + high + 1) // 2
        removed = sum(size - cap - 16 for size in sizes if size > cap + 16)
        if removed >= over:
            low = cap
        else:
            high = cap - 1
    return low


def tool_results(state: TrimState) -> list[int]:
    """The tool results of tool exchanges, in order, that are not dropped: in the history and in
    the exchanges after the latest user message."""
    conversation = state.conversation
    units = [u for turn in conversation.turns for u in turn.units if u.is_tool_exchange]
    units += [u for u in conversation.tail if u.is_tool_exchange]
    return [
        i
        for unit in units
        for i in unit.indices
        if i not in state.dropped and _role(state.messages[i]) in TOOL_RESULT_ROLES
    ]


def _drop_exchanges(state: TrimState, kept: set[int], strategy: str) -> None:
    """Drop tool exchanges whole, oldest first, but those holding a kept result, until it fits."""
    conversation = state.conversation
    units: list[Unit] = [u for turn in conversation.turns for u in turn.units if u.is_tool_exchange]
    units += [u for u in conversation.tail if u.is_tool_exchange]
    for unit in units:
        if state.over() <= 0:
            return
        if kept.intersection(unit.indices) or unit.indices[0] in state.dropped:
            continue
        for index in unit.indices:
            state.drop(index, strategy)


def _tool_name(state: TrimState, index: int) -> str | None:
    """The name of the tool whose result message `index` is: from its call, or its own `name`."""
    message = state.messages[index]
    call_id = message.get("tool_call_id")
    if isinstance(call_id, str):
        for i in range(index - 1, -1, -1):
            calls = state.messages[i].get("tool_calls") if isinstance(state.messages[i], Mapping) else None
            for call in calls if isinstance(calls, list) else ():
                function = call.get("function") if isinstance(call, Mapping) else None
                if call.get("id") == call_id and isinstance(function, Mapping):
                    name = function.get("name")
                    return name if isinstance(name, str) and name else None
    name = message.get("name")
    return name if isinstance(name, str) and name else None


def _role(message: object) -> str | None:
    role = message.get("role") if isinstance(message, Mapping) else None
    return role if isinstance(role, str) else None
