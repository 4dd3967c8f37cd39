"""Counts of a conversation's opening, carried from one request to the next.

A client re-sends its conversation with every turn: the messages it shares with the request
before are counted already (the count cache holds each one), but finding that out is still a
walk over every message (its key, its cache entry, the calls its tool results answer). An
`Opening` is what counting `messages[:size]` left behind: the messages' counts, their sums (a
`Tally`: the request adds up only the messages after) and the state of the walk over tool calls
at that point. Kept in the count cache under the exact sequence of the messages' hashes
(`proxy.wire.prefix_reader`: equal bytes, equal messages), it lets the next request count only what
follows. Its memory: its own tuple of counts (the counts themselves are the cache's message
entries) and the calls and results seen, a few KB for a hundred messages.

What could make the carried counts wrong, and why it does not:
- A message's count depends on the message and, for a `tool` result, on the call it answers,
  which an earlier message makes: the opening is the same messages, so the same calls.
- The one thing a *later* message changes is the first/last mark of a parallel call's results
  (a result of the same call appended after the opening): the opening keeps the marks its counts
  were made with, and when the request's own marks differ it is counted whole.
- Which user message is the latest is decided over the whole request, from the counts, after.

Each request keeps its opening at its own length, and looks up its own length and up to four
shorter, longest first. A request that replaces its last turn (a client retrying or editing)
finds the opening the request before the last one kept, and counts the turn after it from the
message cache: keeping openings one and two short of every request too cost more than that.
When that opening is gone (the cache bounded, other conversations counted since), the request
also keeps the opening at the messages it shares with the earlier body the prefix reader
matched, when they are all but its last few: where its siblings (the same conversation with
another last turn) part from it. Without
it, every later sibling walked the whole conversation again (`make bench`'s new turn after its
cold bodies: 2.1 ms of CPU per request against 1.6).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.costs.tool_calls import ResultContext
from proxy.core.trimming.turns import PINNED_ROLES, TOOL_RESULT_ROLES

KEPT_SHORT_OF_THE_END = (0,)
LOOKED_UP = 5


@dataclass(frozen=True, slots=True)
class Tally:
    """The sums `RequestCounter.request` makes over the counts of the first `size` messages, so
    that a request carrying them adds up only the messages after. The text tokens of a message
    that is neither pinned nor a tool result are in `history`: the request moves its latest user
    message's to `latest_user` when that message lies in here."""

    size: int = 0
    tokens: int = 0
    media: int = 0
    calls: int = 0
    system: int = 0  # text tokens of the system and developer messages
    history: int = 0  # text tokens of every other message but tool results
    results: int = 0  # text tokens of tool and function results
    pinned: int = 0  # all tokens of the system and developer messages
    notes: tuple[str, ...] = ()  # the messages' notes, as the request reports them

    @property
    def footprint(self) -> int:
        """About its bytes: the object and its notes."""
        return 150 + sum(80 + len(note) for note in self.notes) if self.notes else 150

    def plus(self, counts: Sequence[Any]) -> Tally:
        """This tally and the counts of the messages that follow it (`MessageCount`s, in order)."""
        if not counts:
            return self
        tokens, media, calls, pinned = self.tokens, self.media, self.calls, self.pinned
        system, history, results = self.system, self.history, self.results
        notes = self.notes
        for count in counts:  # once per new message of a request: no call of ours in it
            tokens += count.tokens
            media += count.media_tokens
            calls += count.tool_call_tokens
            text = count.tokens - count.media_tokens - count.tool_call_tokens
            if count.role in PINNED_ROLES:
                system += text
                pinned += count.tokens
            elif count.role in TOOL_RESULT_ROLES:
                results += text
            else:
                history += text
            if count.notes:
                notes += tuple(f"messages[{count.index}]: {note}" for note in count.notes)
        return Tally(self.size + len(counts), tokens, media, calls, system, history, results, pinned, notes)


NO_TALLY = Tally()


@dataclass(frozen=True, eq=False)
class Opening:
    """What counting the first `size` messages of a request left behind."""

    size: int
    counts: tuple[Any, ...]  # each message's MessageCount, in order
    calls: Mapping[str, ResultContext]  # the calls made so far, by id
    contexts: Mapping[int, ResultContext]  # each `tool` result's, without the group marks
    marked: Mapping[int, ResultContext]  # the group-marked contexts its counts were made with
    tally: Tally = NO_TALLY  # the sums over `counts`
    # Every context with its group marks as they stand at `size`, which are the marks its counts
    # were made with: kept where the request ended (shared with it; `contexts` itself when no
    # call was parallel), so that a request that goes on without a tool call or result reads no
    # table; None for one kept where a request went on.
    flagged: Mapping[int, ResultContext] | None = None

    @property
    def footprint(self) -> int:
        """About the bytes it holds of its own (for the count cache's bound): its tuple of counts
        (the counts are the cache's message entries) and its three dicts (their contexts are
        shared between the openings of one request). tracemalloc: 2.2 KB of dicts and a 0.8 KB
        tuple for 96 messages with 23 calls; this says 3.7 KB."""
        flagged = self.flagged if self.flagged is not None and self.flagged is not self.contexts else ()
        entries = len(self.calls) + len(self.contexts) + len(self.marked) + len(flagged)
        return 200 + 8 * len(self.counts) + 60 * entries + self.tally.footprint


def opening_key(scope: int, hashes: Sequence[int], size: int) -> Hashable:
    """The cache key of the opening of `size` messages whose hashes are `hashes[:size]`: as a
    message is keyed by a 64-bit hash of its bytes, an opening is keyed by one of theirs."""
    return (scope, "opening", size, hash(tuple(hashes[:size])))


def sizes_to_look_up(length: int, shared: int = 0) -> tuple[int, ...]:
    """The opening sizes a request of `length` messages looks for: `shared` first, the messages
    it holds of the earlier body the prefix reader matched, when that is one of them (the
    request before kept its opening there: a new turn finds it with its first look, not its
    third); then the others, longest first."""
    sizes = range(length, max(0, length - LOOKED_UP), -1)
    if shared in sizes and shared != length:
        return (shared, *(size for size in sizes if size != shared))
    return tuple(sizes)


def sizes_to_keep(length: int, shared: int = 0, carried: int = 0) -> tuple[int, ...]:
    """The opening sizes a request of `length` messages keeps: its own; and `shared`, the
    messages it holds of an earlier body, when the opening it carried is shorter than that and a
    sibling of its length would look it up (one that shares only a system prompt would not)."""
    own = tuple(length - short for short in KEPT_SHORT_OF_THE_END if length - short > 0)
    if carried < shared < length and shared > length - LOOKED_UP and shared not in own:
        return (*own, shared)
    return own


def still_marked_alike(opening: Opening, marked: Mapping[int, ResultContext]) -> bool:
    """Whether the request's group marks of the opening's results are the ones its counts were
    made with."""
    return all(marked.get(index) == context for index, context in opening.marked.items())
