"""Text tokenizers as the core sees them, and the bounded cache of their counts.

The core never loads a vocabulary: the shell (`proxy.tokenizers.vocabularies`) builds the encoders and
hands them in. A tokenizer here is anything with a `name` and `count(text) -> int`.

Three kinds exist:
- an exact encoder (tiktoken's `Encoding`, a Hugging Face `Tokenizer`) wrapped in `EncoderTokenizer`;
- the same encoder scaled by a safety multiplier (`EncoderTokenizer(multiplier=1.45)`), for model
  families whose own tokenizer is not available but whose ratio to it is known and measured;
- `CharEstimateTokenizer`, a character-based estimate that never reads a vocabulary.

`CountCache` remembers counts of long texts keyed by (tokenizer identity, content digest), so a
conversation that is re-sent every turn costs only its new messages. The identity names the
vocabulary completely (for a tokenizer file, its path and a hash of its content), never just a
display name: two `tokenizer.json` files with the same name must never share counts.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.core.cancellation import checkpoint
from proxy.core.slices import SLICE_CHARS, spans, utf8_bytes


class Tokenizer(Protocol):
    """Counts the tokens of a text. `name` is for reports; `identity` (what caches key on)
    identifies the vocabulary completely, with any scaling."""

    @property
    def name(self) -> str: ...

    @property
    def identity(self) -> str: ...

    @property
    def exact(self) -> bool: ...

    def count(self, text: str) -> int: ...

    def count_many(self, texts: list[str]) -> list[int]: ...


@dataclass(frozen=True, slots=True)
class EncoderTokenizer:
    """Counts with a real encoder, optionally scaled up by a safety multiplier.

    `encode` returns token ids for a text with no special-token handling: user content that
    happens to contain `<|endoftext|>` is text, which is how the providers treat it.

    A text longer than `SLICE_CHARS` is counted in slices cut where the count stays exact
    (`proxy.core.slices`), so that no token list longer than a slice's is ever held; stretches
    with no such cut are counted by `bound` (UTF-8 bytes: one token a byte at most for byte-level
    BPE) and noted (`BoundedText`). `sliceable` False (a vocabulary whose pre-tokeniser the cut
    rule was not proven for, such as SentencePiece's) encodes every text whole, as before.
    Whatever the native encoder raises (tiktoken panics on about a million spaces in a row with
    a `BaseException`) is caught short of cancellation and exit, and that text counted by `bound`.
    """

    base_name: str
    encode: Callable[[str], list[int]] | Callable[[str], object]
    multiplier: float = 1.0
    # Encodes many texts at once, in parallel where the encoder can (tiktoken's batch API
    # releases the GIL across threads); None to encode them one by one.
    encode_batch: Callable[[list[str]], list[list[int]]] | None = None
    # Where the vocabulary came from, when `base_name` alone does not say (a tokenizer file's path
    # and content hash); part of `identity`, so counts are never shared between two vocabularies.
    source_id: str = ""
    sliceable: bool = True
    # An upper bound of the count of a text, without encoding it (UTF-8 bytes by default).
    bound: Callable[[str], int] = utf8_bytes

    @property
    def name(self) -> str:
        return self.base_name if self.multiplier == 1.0 else f"{self.base_name}x{self.multiplier:g}"

    @property
    def identity(self) -> str:
        return f"{self.name}@{self.source_id}" if self.source_id else self.name

    @property
    def exact(self) -> bool:
        return self.multiplier == 1.0

    def count(self, text: str) -> int:
        if not text:
            return 0
        n = self._encoded_length(text) if len(text) <= SLICE_CHARS or not self.sliceable else self._sliced(text)
        return n if self.multiplier == 1.0 else math.ceil(n * self.multiplier)

    def count_many(self, texts: list[str]) -> list[int]:
        if self.encode_batch is None or len(texts) < 2:
            return [self.count(t) for t in texts]
        whole = [i for i, t in enumerate(texts) if len(t) <= SLICE_CHARS or not self.sliceable]
        counts = [0] * len(texts)
        batch: list[int] = []
        chars = 0
        for position, i in enumerate(whole):  # batches of about `_BATCH_CHARS`: their token lists are held together
            batch.append(i)
            chars += len(texts[i])
            if chars >= _BATCH_CHARS or position == len(whole) - 1:
                for j, n in zip(batch, self._batch_lengths([texts[j] for j in batch]), strict=True):
                    counts[j] = n
                batch, chars = [], 0
        for i, text in enumerate(texts):
            if len(text) > SLICE_CHARS and self.sliceable:
                counts[i] = self._sliced(text)
        if self.multiplier == 1.0:
            return counts
        return [math.ceil(n * self.multiplier) for n in counts]

    def _batch_lengths(self, texts: list[str]) -> list[int]:
        assert self.encode_batch is not None
        try:
            return [len(ids) for ids in self.encode_batch(texts)]
        except _PASSED_ON:
            raise
        except BaseException:  # a native panic: each text alone, as far as it counts
            return [self._encoded_length(t) for t in texts]

    def _encoded_length(self, text: str) -> int:
        try:
            return len(self.encode(text))  # type: ignore[arg-type]  # both encoders return sized sequences
        except _PASSED_ON:
            raise
        except BaseException:  # a native library's panic or error: bounded instead
            bound = self.bound(text)
            _note_bounded(len(text), "the encoder failed on it")
            return bound

    def _sliced(self, text: str) -> int:
        total = 0
        for span in spans(text, SLICE_CHARS):
            checkpoint()  # a request whose client hung up stops here (proxy.core.cancellation)
            if span.exact:
                total += self._encoded_length(text[span.start : span.end])
            else:
                total += self.bound(text[span.start : span.end])
                _note_bounded(span.end - span.start, "no word boundary")
        return total


# Characters of short texts encoded in one batch call (their token lists are held together: about
# 10 MB for prose), enough for the encoder to spread them over threads.
_BATCH_CHARS = 1024 * 1024
# What a native encoder's failure is never taken for: the task's cancellation and the process's exit.
_PASSED_ON = (asyncio.CancelledError, KeyboardInterrupt, SystemExit, GeneratorExit)


@dataclass(slots=True)
class BoundedText:
    """What a request's counting bounded instead of encoding: stretches and their characters."""

    stretches: int = 0
    chars: int = 0
    reasons: set[str] = field(default_factory=set)

    def note(self) -> str | None:
        if not self.stretches:
            return None
        why = " and ".join(sorted(self.reasons))
        return (
            f"text: {self.stretches} stretch(es) of {self.chars} characters ({why}) counted at one token per "
            "UTF-8 byte, an upper bound"
        )


_BOUNDED: ContextVar[BoundedText | None] = ContextVar("context_guard_bounded_text", default=None)


def note_bounded_text() -> Token[BoundedText | None]:
    """Start recording, for the counting that follows in this thread or task, what is bounded
    instead of encoded; `bounded_text(token)` ends it and returns the record."""
    return _BOUNDED.set(BoundedText())


def bounded_text(token: Token[BoundedText | None]) -> BoundedText:
    record = _BOUNDED.get() or BoundedText()
    _BOUNDED.reset(token)
    return record


def _note_bounded(chars: int, reason: str) -> None:
    record = _BOUNDED.get()
    if record is not None:
        record.stretches += 1
        record.chars += chars
        record.reasons.add(reason)


@dataclass(frozen=True, slots=True)
class CharEstimateTokenizer:
    """An estimate with no vocabulary: one token per `chars_per_token` ASCII characters, and each
    other character counted as one token (`non_ascii="char"`: CJK and emoji run near one token
    each in large vocabularies) or as one token per UTF-8 byte (`non_ascii="byte"`: the upper
    bound of a small vocabulary that falls back to bytes)."""

    chars_per_token: float = 3.0
    non_ascii: str = "char"

    @property
    def name(self) -> str:
        suffix = ":bytes" if self.non_ascii == "byte" else ""
        return f"estimate:{self.chars_per_token:g}{suffix}"

    @property
    def identity(self) -> str:
        return self.name

    @property
    def exact(self) -> bool:
        return False

    def count(self, text: str) -> int:
        if not text:
            return 0
        if text.isascii():
            return math.ceil(len(text) / self.chars_per_token)
        ascii_chars = sum(1 for ch in text if ord(ch) < 128)
        if self.non_ascii == "byte":
            other = len(text.encode("utf-8", "surrogatepass")) - ascii_chars
        else:
            other = len(text) - ascii_chars
        return math.ceil(ascii_chars / self.chars_per_token) + other

    def count_many(self, texts: list[str]) -> list[int]:
        return [self.count(t) for t in texts]


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
