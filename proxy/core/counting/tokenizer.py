"""Text tokenizers as the core sees them, the note of what they bounded instead of encoding, and
the tokenizers that count a request with a backend's counts.

The core never loads a vocabulary: the shell (`proxy.tokenizers.vocabularies`) builds the encoders and
hands them in. A tokenizer here is anything with a `name`, an `identity` and `count(text) -> int`.

Three kinds exist:
- an exact encoder (tiktoken's `Encoding`, a Hugging Face `Tokenizer`) wrapped in `EncoderTokenizer`;
- the same encoder scaled by a safety multiplier (`EncoderTokenizer(multiplier=1.45)`), for model
  families whose own tokenizer is not available but whose ratio to it is known and measured;
- `CharEstimateTokenizer`, a character-based estimate that never reads a vocabulary.

The cache of their counts is `proxy.core.counting.count_cache`.

`EncoderTokenizer` counts a stretch of text by an upper bound when it cannot be cut where the count
stays exact, or when the native encoder fails on it. The counter
(`proxy.core.counting.request_count`) wants to say so on the request's record, but the tokenizer is
called deep inside counting with no request in hand: a ContextVar carries the note (`BoundedText`)
for the counting of one request, in its thread or task, and nothing else.

The core counts synchronously; a backend answers over the network. So a request counted with a
backend's own tokenizer is counted twice: first with a `RecordingTokenizer` (the local tokenizer,
every text it is asked about remembered), then, once the backend has counted those texts
(`proxy.server.backends.tokenize`), with a `PrefetchedTokenizer` holding the answers.
`tool_call_texts` names the texts a template that drops tool calls never shows.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping
from contextvars import ContextVar, Token
from dataclasses import dataclass, field
from typing import Any, Protocol

from proxy.core.counting.bound import SLICE_CHARS, spans, utf8_bytes
from proxy.core.work_budget import checkpoint, spend


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


def note_bounded(chars: int, reason: str) -> None:
    """Record a stretch of `chars` characters counted by a bound, when a recording is under way."""
    record = _BOUNDED.get()
    if record is not None:
        record.stretches += 1
        record.chars += chars
        record.reasons.add(reason)


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
    (`proxy.core.counting.bound`), so that no token list longer than a slice's is ever held; stretches
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
    # From how many characters a batch goes to `encode_batch` (whose threads cost more than they
    # save on less); a smaller batch is encoded text by text here.
    batch_from_chars: int = 0

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
        spend(len(text))
        n = self._encoded_length(text) if len(text) <= SLICE_CHARS or not self.sliceable else self._sliced(text)
        return n if self.multiplier == 1.0 else math.ceil(n * self.multiplier)

    def count_many(self, texts: list[str]) -> list[int]:
        if self.encode_batch is None or len(texts) < 2:
            return [self.count(t) for t in texts]
        spend(sum(map(len, texts)))
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
            if sum(map(len, texts)) < self.batch_from_chars:
                return [len(self.encode(t)) for t in texts]  # type: ignore[arg-type]  # both encoders return sized sequences
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
            note_bounded(len(text), "the encoder failed on it")
            return bound

    def _sliced(self, text: str) -> int:
        total = 0
        for span in spans(text, SLICE_CHARS):
            checkpoint()  # a request whose client hung up stops here (proxy.core.work_budget)
            if span.exact:
                total += self._encoded_length(text[span.start : span.end])
            else:
                total += self.bound(text[span.start : span.end])
                note_bounded(span.end - span.start, "no word boundary")
        return total


# Characters of short texts encoded in one batch call (their token lists are held together: about
# 10 MB for prose), enough for the encoder to spread them over threads.
_BATCH_CHARS = 1024 * 1024
# What a native encoder's failure is never taken for: the task's cancellation and the process's exit.
_PASSED_ON = (asyncio.CancelledError, KeyboardInterrupt, SystemExit, GeneratorExit)



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


def tool_call_texts(body: Mapping[str, Any]) -> set[str]:
    """The names and arguments of the assistant tool calls in `body`."""
    texts: set[str] = set()
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        calls = message.get("tool_calls") if isinstance(message, Mapping) else None
        for call in calls if isinstance(calls, list) else ():
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping):
                texts.update(v for v in (function.get("name"), function.get("arguments")) if isinstance(v, str))
    return texts


@dataclass
class RecordingTokenizer:
    """Counts with `base` and remembers every text it was asked about."""

    base: Tokenizer
    texts: set[str] = field(default_factory=set)

    @property
    def name(self) -> str:
        return self.base.name

    @property
    def identity(self) -> str:
        return self.base.identity

    @property
    def exact(self) -> bool:
        return self.base.exact

    def count(self, text: str) -> int:
        if text:
            self.texts.add(text)
        return self.base.count(text)

    def count_many(self, texts: list[str]) -> list[int]:
        return [self.count(t) for t in texts]


@dataclass
class PrefetchedTokenizer:
    """The backend's counts of one request's texts; any other text (one a trim shortened, a note
    it inserted) is counted by `fallback` and remembered in `missing`, and then the count is no
    longer exact until `BackendCounter.complete()` has fetched those too. One per request: never
    cache counts under its name."""

    name: str
    counts: dict[str, int]
    fallback: Tokenizer
    missing: set[str] = field(default_factory=set)
    # After `bound_missing()`, a text the backend has not counted costs at most its UTF-8 bytes
    # plus one (no byte-level BPE or byte-fallback SentencePiece token is shorter than a byte; the
    # one is a dummy-prefix space): a plan made then cannot undercount, whatever the estimate.
    bounded: bool = False

    @property
    def identity(self) -> str:
        return self.name

    @property
    def exact(self) -> bool:
        return not self.missing

    def count(self, text: str) -> int:
        if not text:
            return 0
        n = self.counts.get(text)
        if n is None:
            self.missing.add(text)
            estimate = self.fallback.count(text)
            return max(estimate, len(text.encode("utf-8", "surrogatepass")) + 1) if self.bounded else estimate
        return n

    def bound_missing(self) -> None:
        """From now on, texts the backend has not counted are counted by their upper bound."""
        self.bounded = True

    def count_many(self, texts: list[str]) -> list[int]:
        return [self.count(t) for t in texts]
