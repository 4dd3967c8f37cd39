"""The bounded cache of token counts, shared by every request of a process, and the counts of a
conversation's opening it carries from one request to the next.

`CountCache` remembers counts of long texts keyed by (tokenizer identity, content digest), and
whole messages' counts keyed by (counting scope, fingerprint), so a conversation that is re-sent
every turn costs only its new messages. The identity names the vocabulary completely (for a
tokenizer file, its path and a hash of its content), never just a display name: two
`tokenizer.json` files with the same name must never share counts. `ScopedCountCache` is one
client's view of it. `entry_bytes` estimates what an entry weighs, so that the cache is bounded in
bytes as well as in entries.

**Openings.** A client re-sends its conversation with every turn: the messages it shares with the
request before are counted already (the count cache holds each one), but finding that out is still a
walk over every message (its key, its cache entry, the calls its tool results answer). An `Opening`
is what counting `messages[:size]` left behind: the messages' counts, their sums (a `Tally`: the
request adds up only the messages after) and the state of the walk over tool calls at that point.
Kept in the count cache under the exact sequence of the messages' hashes
(`proxy.wire.prefix_reader`: equal bytes, equal messages), it lets the next request count only what
follows. Its memory: its own tuple of counts (the counts themselves are the cache's message entries)
and the calls and results seen, a few KB for a hundred messages.

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
another last turn) part from it. Without it, every later sibling walked the whole conversation
again.
"""

from __future__ import annotations

import hashlib
import sys
import threading
from collections import OrderedDict
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.core.costs.tool_calls import ResultContext
from proxy.core.trimming.budget import PINNED_ROLES, TOOL_RESULT_ROLES


class Tokenizer(Protocol):
    """What the cache asks of a tokenizer (`proxy.core.counting.tokenizer.Tokenizer` has it): the identity
    its keys are made of, and counts of what is not cached. Asked here, not imported, so the
    tokenizers' module can name the cache without a circle."""

    @property
    def identity(self) -> str: ...

    def count(self, text: str) -> int: ...

    def count_many(self, texts: list[str]) -> list[int]: ...


# The default bound of a `CountCache` in bytes. A cold 25 KB chat request adds about 45 entries
# (each message, and each text of 256+ characters), estimated at 460 bytes each (RSS grows by
# about 350): 16 MiB holds the counts of about 800 such requests, the messages of some hundreds
# of conversations being re-sent.
DEFAULT_CACHE_BYTES = 16 * 1024 * 1024
# What an entry costs the OrderedDict besides its key and value objects: the dict's table (each
# rebuild sizes it for three times the live entries, rounded up to a power of two: 2-4 slots of
# 24 bytes and 3-6 index cells of 4 bytes per entry) and the order's node (48 bytes, and 8 for
# its pointer in the node table).
_SLOT_BYTES = 176
# Short repeating strings (roles, names) remembered per tokenizer beside the bounded map: at most
# this many of at most this many characters, about 0.5 MB at worst.
SHORT_ENTRIES = 4096
SHORT_TEXT = 64
# Shapes of entry whose size a cache remembers (a few are used: message, text, tool definitions).
_MAX_SHAPES = 64


def entry_bytes(key: Hashable, value: object) -> int:
    """An estimate of what one cache entry holds in memory: its dict slot, the key and the value,
    with the parts of tuples (keys, named tuples) and the fields of slotted records (a message's
    count). Parts that entries share (the tokenizer's identity, a role name) are counted in every
    entry, so the estimate errs high. A value that says what it weighs (an `int` `footprint`, as
    an `Opening` of a conversation does) is taken at its word."""
    return _SLOT_BYTES + _footprint(key, 2) + _value_bytes(value)


def _value_bytes(value: object) -> int:
    own = getattr(value, "footprint", None)
    return own if type(own) is int else _footprint(value, 2)


def _footprint(obj: object, depth: int) -> int:
    if obj is None or obj is True or obj is False:  # singletons: held by every entry for free
        return 0
    size = sys.getsizeof(obj)
    if depth:
        if isinstance(obj, tuple):
            size += sum(_footprint(part, depth - 1) for part in obj)
        else:
            for name in getattr(type(obj), "__slots__", ()):
                size += _footprint(getattr(obj, name, None), depth - 1)
    return size


class CountCache:
    """A bounded LRU map of counts: texts by (tokenizer identity, text digest), and whole messages by
    (counting scope, message fingerprint), so a re-sent conversation costs only its new messages.

    Only texts of at least `min_chars` characters are cached: shorter ones cost less to encode
    than to hash. Text keys are 16-byte BLAKE2b digests and message keys are hashes, so the
    cache never holds message content. Its memory is bounded twice: by `max_entries`, and by
    `max_bytes` as `entry_bytes()` estimates each entry, so that it stops growing at a known
    size whatever the entries are (a message's count weighs more than a text's).

    Reads are shared between threads without a lock: each OrderedDict operation is atomic under
    the GIL, and the worst a race can do is miss moving an entry another thread just evicted.
    Writes take a lock, so that the running total of bytes stays exact. The order is an
    OrderedDict's, not a dict's popped and re-inserted: evicting the oldest of a plain dict scans
    past every slot deleted before it (25 us a put once the cache is full, against about 5 now).
    """

    def __init__(self, max_entries: int = 100_000, min_chars: int = 256, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        if max_entries < 0:
            raise ValueError("max_entries must be >= 0")
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        self.max_entries = max_entries if max_bytes else 0  # no room at all: nothing is cached
        self.max_bytes = max_bytes
        self.min_chars = min_chars
        self.hits = 0
        self.misses = 0
        self.bytes = 0  # self.entry_bytes() of the entries held
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()
        self._writing = threading.Lock()
        self._shape_bytes: dict[tuple[type, ...], tuple[int, bool]] = {}  # (bytes, plus a footprint?)
        self._short: dict[str, dict[str, int]] = {}  # short texts' counts, by tokenizer identity

    def __len__(self) -> int:
        return len(self._entries)

    def short_counts(self, tokenizer: Tokenizer) -> dict[str, int]:
        """The counts of short repeating strings (roles, names) with `tokenizer`, for the counter
        to read and fill (`SHORT_ENTRIES` of at most `SHORT_TEXT` characters): encoding "user"
        again for every request cost more than the lookup."""
        if self.max_entries == 0:  # no room at all: nothing is remembered
            return {}
        counts = self._short.get(tokenizer.identity)
        if counts is None:
            counts = self._short.setdefault(tokenizer.identity, {})
        return counts

    @staticmethod
    def key(tokenizer: Tokenizer, text: str) -> tuple[str, bytes]:
        return (tokenizer.identity, hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest())

    def get(self, key: Hashable) -> Any:
        entries = self._entries
        value = entries.get(key)
        if value is None:
            return None
        try:  # noqa: SIM105  # not contextlib.suppress: a context manager per hit on the hot path
            entries.move_to_end(key)  # most recently used goes last
        except KeyError:  # evicted by another thread meanwhile: the count stands
            pass
        self.hits += 1
        return value

    def get_many(self, keys: list[Hashable | None]) -> list[Any]:
        """`get()` of each key (None for a None key), in one call: a request asks for every message."""
        entries = self._entries
        found: list[Any] = []
        hits = 0
        for key in keys:
            value = entries.get(key) if key is not None else None
            if value is not None:
                try:  # noqa: SIM105  # as in get()
                    entries.move_to_end(key)  # most recently used goes last
                except KeyError:  # evicted by another thread meanwhile: the count stands
                    pass
                hits += 1
            found.append(value)
        self.hits += hits
        return found

    def entry_bytes(self, key: Hashable, value: object) -> int:
        """`entry_bytes()`, measured once per shape of entry (the types of the key's parts and of
        the value) and remembered: measuring every entry would cost a put a tenth of the count it
        stores. A value with its own `footprint` is asked each time. The same entry always gets
        the same figure, so the total stays exact."""
        shape = (type(value), *map(type, key)) if type(key) is tuple else (type(value), type(key))
        known = self._shape_bytes.get(shape)
        if known is None:
            # A value whose weight varies with it (an opening's length) has only the rest remembered.
            varies = type(getattr(value, "footprint", None)) is int
            known = (_SLOT_BYTES + _footprint(key, 2) if varies else entry_bytes(key, value), varies)
            if len(self._shape_bytes) < _MAX_SHAPES:
                known = self._shape_bytes.setdefault(shape, known)  # a racing thread's figure wins
        fixed, varies = known
        return fixed + value.footprint if varies else fixed  # type: ignore[attr-defined]  # varies: it has one

    def put(self, key: Hashable, value: Any) -> None:
        self.misses += 1
        if self.max_entries == 0:
            return
        size = self.entry_bytes(key, value)
        entries = self._entries
        with self._writing:
            replaced = entries.pop(key, None)
            if replaced is not None:
                self.bytes -= self.entry_bytes(key, replaced)
            entries[key] = value
            self.bytes += size
            while entries and (len(entries) > self.max_entries or self.bytes > self.max_bytes):
                oldest, evicted = entries.popitem(last=False)
                self.bytes -= self.entry_bytes(oldest, evicted)

    def count(self, tokenizer: Tokenizer, text: str) -> int:
        if self.max_entries == 0 or len(text) < self.min_chars:
            return tokenizer.count(text)
        key = self.key(tokenizer, text)
        cached: int | None = self.get(key)
        if cached is None:
            cached = tokenizer.count(text)
            self.put(key, cached)
        return cached

    def count_many(self, tokenizer: Tokenizer, texts: list[str]) -> list[int]:
        """Counts of `texts`, the ones the cache lacks encoded together in one batch."""
        if self.max_entries == 0:
            return tokenizer.count_many(texts)
        keys = [self.key(tokenizer, t) for t in texts]
        counts: list[int | None] = [self.get(k) for k in keys]
        missing = [i for i, c in enumerate(counts) if c is None]
        for i, value in zip(missing, tokenizer.count_many([texts[i] for i in missing]), strict=True):
            counts[i] = value
            self.put(keys[i], value)
        return [c or 0 for c in counts]  # every None was filled above


class ScopedCountCache(CountCache):
    """One client's view of a shared `CountCache`: every key it reads or writes is the pair
    (scope, key), so a count one client's text left is never a hit for another, and the time a
    request takes cannot tell a client whether someone else sent a text (a hit is 10x faster than
    a count). The entries, their bound, the lock and the statistics are the shared cache's; the
    view costs a tuple per key. Counts of short strings (`short_counts`: roles, names, at most
    `SHORT_TEXT` characters) stay shared: encoding one costs about as much as looking it up."""

    def __init__(self, shared: CountCache, scope: Hashable) -> None:  # no super().__init__: a view
        self.shared, self.scope = shared, scope
        self.max_entries, self.min_chars, self.max_bytes = shared.max_entries, shared.min_chars, shared.max_bytes

    def __len__(self) -> int:
        return len(self.shared)

    def short_counts(self, tokenizer: Tokenizer) -> dict[str, int]:
        return self.shared.short_counts(tokenizer)

    def get(self, key: Hashable) -> Any:
        return self.shared.get((self.scope, key))

    def get_many(self, keys: list[Hashable | None]) -> list[Any]:
        scope = self.scope
        return self.shared.get_many([(scope, key) if key is not None else None for key in keys])

    def put(self, key: Hashable, value: Any) -> None:
        self.shared.put((self.scope, key), value)


def count_text(tokenizer: Tokenizer, text: str, cache: CountCache | None) -> int:
    """Count one text, through the cache when there is one."""
    return cache.count(tokenizer, text) if cache is not None else tokenizer.count(text)


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
