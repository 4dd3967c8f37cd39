"""Counts bounded from above where they cannot be exact: where the model's own tokenizer does not
ship, where a long text cannot be cut into exactly counted slices, and what the provider decrypts.

**Where the model's tokenizer does not ship** (Claude's current one, Gemini's and Gemma's, Llama
2's, unknown models). A bound is a real encoding's count (cl100k_base) scaled by a multiplier, plus
a term per text class that costs more in other vocabularies than in cl100k: digits (cl100k writes
three to a token; SentencePiece vocabularies one each), newlines and runs of spaces or tabs
(SentencePiece vocabularies fall back to one token per newline byte), and scripts that cl100k
encodes more cheaply than some vocabularies do (Thai, Arabic; other non-ASCII characters such as
emoji).

The terms were fitted to the corpus in tests/data/families (every text class: prose in eleven
languages, code, JSON, CSV, logs, hex, UUIDs, base64, digits, whitespace runs, emoji) against every
real vocabulary that ships offline, then rounded up; tests/core/models/test_families_bounds.py
proves them never under on that corpus, and bench/families.py writes the ratios to
docs/benchmarks.md.

**Slices.** Where a long text may be cut so that its slices, encoded one by one, count exactly what
the whole would; and a bound for the stretches that cannot be cut. Encoding a whole text
materialises its token list (12-45x the text in memory: Python ints in a list) and gives byte-pair
encoding one pre-token as long as the longest run of letters, on which it is superlinear. Counting
slices of at most `SLICE_CHARS` characters bounds both.

**Where a cut is exact.** The pre-tokenisers of byte-level BPE vocabularies (GPT-2's, tiktoken's
cl100k_base and o200k_base, Llama 3's, Qwen2's, DeepSeek's, tekken's) are regular expressions with
no look-behind and no anchor, whose only look-ahead is `(?!\\S)` after whitespace. Cut at position
`i` when `text[i - 1]` is a letter or a number and `text[i]` is one of the spaces or punctuation
marks of `_CUT_BEFORE` (never an apostrophe, a letter, a number or a combining mark):
- no pre-token spans `i`: the one holding `text[i - 1]` is a run of letters (and marks), a run of
  numbers, or a contraction (`'s`); none can take `text[i]`;
- the prefix splits as in the whole: every alternative that reaches `i` asks whether `text[i]`
  is a letter, a mark, a number or an apostrophe, and the end of the text answers as `text[i]`
  does (no); whitespace alternatives cannot reach `i` across a letter;
- the suffix splits as in the whole: with no look-behind, matching from `i` does not see before it.
So the pre-tokens of the slices are those of the whole, and BPE encodes each pre-token alone. The
cut characters are all starters that compose with nothing before them, so NFC/NFKC normalisers
(Qwen2's NFC) also normalise the slices as the whole.

**Where no cut is found.** A stretch with no cut point in the last half of a slice's room (at
least `SLICE_CHARS // 2` characters of letters with no space or punctuation after them, of
whitespace, or of punctuation) is not encoded: it is counted as one token per UTF-8 byte, an
upper bound for byte-level BPE (every token covers at least one byte). Such stretches are
adversarial or machine-made (random letters, a megabyte of spaces, a digit string): the count
errs high on them, and the counter records that it did (`BoundedText`).

Everything here is linear in the text: each character is scanned a bounded number of times by
regular expressions of single character classes (nothing can backtrack across a run).

**Ciphertext**: what the provider reads that the guard cannot see as text. Codex and other Responses
clients send their model's reasoning back with every turn as `reasoning` items whose
`encrypted_content` the provider decrypts into the context. The guard cannot read it, but its size
bounds it: base64 of `n` characters decodes to at most `3n/4` bytes, the plaintext is no longer than
the ciphertext, and every token of a byte-level tokenizer stands for at least one byte, so the
reasoning counts at most that many tokens. The bound assumes the plaintext is not compressed before
it is encrypted (nothing published says either way); it errs high by the ciphertext's own overhead
and by every multi-byte token.

Context held by id (a stored response, a conversation, a cache) is counted elsewhere: from the
ledger of the provider's own answers (`proxy.state.store`), as the exchange's `held`.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from proxy.core.work_budget import checkpoint

_RUNS = re.compile(r"[ \t]{2,}")
# An ASCII punctuation mark right before a letter or digit (`,true`, `{"id`, `.method`, `\nline`).
_WORD_STARTS = re.compile(r"[!-/:-@\[-`{-~](?=[A-Za-z0-9])")
_THAI = re.compile(r"[\u0e00-\u0e7f]")
_ARABIC = re.compile(r"[\u0600-\u06ff\u0750-\u077f]")
_HANGUL = re.compile(r"[\u1100-\u11ff\uac00-\ud7af]")
_CJK = re.compile(r"[\u3040-\u30ff\u4e00-\u9fff]")  # kana and the common ideographs
# Scripts cl100k is not cheaper on than the vocabularies measured (Cyrillic, Indic): no term.
_COVERED = re.compile(r"[\u0400-\u04ff\u0900-\u0dff]")


@dataclass(frozen=True, slots=True)
class BoundTerms:
    """Tokens a bound adds to `multiplier` x the base count, per character of each class."""

    multiplier: float
    digit: float = 0.0
    newline: float = 0.0
    run: float = 0.0  # per space or tab of a run, beyond its first
    thai: float = 0.0
    arabic: float = 0.0
    hangul: float = 0.0
    cjk: float = 0.0
    other: float = 0.0  # other non-ASCII characters (emoji, accented Latin, symbols)
    # per punctuation mark that opens a word: cl100k writes most such pairs as one token (`,true`,
    # `":"`), SentencePiece vocabularies as two (minified JSON: `[true,false,null]` costs Llama 2 and
    # Mistral twice what it costs cl100k)
    word_start: float = 0.0
    # The most this bound was measured above a real count it stands for, on every corpus text
    # (tests/core/models/test_families_bounds.py checks it): real >= bound / worst_ratio, the lower bound
    # that tells the guard when to ask the provider's own count (proxy.core.counting.edge).
    worst_ratio: float | None = None


# Claude: fitted to the legacy Claude vocabulary litellm ships (the modern one is not published:
# Anthropic states its newest tokenizer writes up to 1.35x its predecessors' tokens, which the
# multiplier allows for; `prose` then loses 22% of the window against the legacy count).
CLAUDE_BOUND = BoundTerms(multiplier=1.3, digit=0.1, thai=0.65, arabic=0.15, worst_ratio=1.5)
# Every other model without a shipped tokenizer (Gemini, Gemma, Llama 2, unknown): the largest
# count of any vocabulary measured (Llama 3/4, Qwen, Mistral Tekken and SentencePiece, DeepSeek,
# legacy Claude, and Gemma 4's and Llama 2's from llama.cpp's vocabulary GGUFs) on each text class,
# rounded up. The 32k SentencePiece vocabularies (Mistral v1, Llama 2) set the digit, newline,
# whitespace and word-start terms, and Llama 2's byte fallback the Hangul and emoji ones
# (tests/core/counting/test_llama2_bound.py checks minified JSON and Korean against Llama 2's real vocabulary).
OPEN_BOUND = BoundTerms(
    multiplier=1.2,
    digit=0.65,
    newline=0.9,
    run=0.2,
    thai=0.7,
    arabic=0.15,
    hangul=0.55,
    cjk=0.05,
    other=1.35,
    word_start=0.85,
    worst_ratio=9.0,  # Thai, against the vocabulary that spends fewest tokens on it
)
BOUNDS: dict[str, BoundTerms] = {"claude": CLAUDE_BOUND, "open": OPEN_BOUND}


# A text longer than this is measured for its class terms a window at a time: no copy or list of
# matches longer than a window's is ever held, and a request whose client left stops between two.
TERMS_WINDOW = 64 * 1024


def class_terms(text: str, terms: BoundTerms) -> float:
    """The per-class tokens `terms` add to a text's scaled base count, measured a window at a time.

    Every term is a sum over characters, so windows add up to the whole, except a run of spaces
    or tabs cut between two windows: each part loses at most one of its characters' term, so one
    `terms.run` per cut keeps the sum an upper bound."""
    if len(text) <= TERMS_WINDOW:
        return _window_terms(text, terms)
    total = 0.0
    for at in range(0, len(text), TERMS_WINDOW):
        checkpoint()  # a request whose client hung up stops here (proxy.core.work_budget)
        total += _window_terms(text[at : at + TERMS_WINDOW], terms)
    return total + terms.run * ((len(text) - 1) // TERMS_WINDOW)


def _window_terms(text: str, terms: BoundTerms) -> float:
    extra = 0.0
    if terms.digit:
        extra += terms.digit * sum(map(text.count, "0123456789"))
    if terms.newline:
        extra += terms.newline * text.count("\n")
    if terms.word_start:
        extra += terms.word_start * len(_WORD_STARTS.findall(text))
    if terms.run and ("  " in text or "\t" in text):
        extra += terms.run * sum(m.end() - m.start() - 1 for m in _RUNS.finditer(text))
    if not text.isascii():
        scripts = [
            (weight, len(pattern.findall(text)) if weight or terms.other else 0)
            for weight, pattern in (
                (terms.thai, _THAI),
                (terms.arabic, _ARABIC),
                (terms.hangul, _HANGUL),
                (terms.cjk, _CJK),
                (0.0, _COVERED),
            )
        ]
        extra += sum(weight * n for weight, n in scripts)
        if terms.other:
            non_ascii = len(text) - len(text.encode("ascii", "ignore"))
            extra += terms.other * (non_ascii - sum(n for _, n in scripts))
    return extra


@dataclass(frozen=True, slots=True)
class BoundTokenizer:
    """Counts an upper bound: `terms.multiplier` x `base_count` plus the class terms, rounded up.

    `base_count` (and `base_count_many`) is the base encoding's counting path, an
    `EncoderTokenizer`'s (`proxy.tokenizers.bounded.bound_tokenizer` builds it so): the work
    budget, slicing, the one-token-per-byte rule, the fallback on a native panic and the
    cancellation checkpoints are the exact tokenizers' own, and the class terms are measured a
    window at a time (`class_terms`) after the base count has spent the text's characters."""

    base_name: str
    base_count: Callable[[str], int]
    terms: BoundTerms
    bound_name: str
    base_count_many: Callable[[list[str]], list[int]] | None = None

    @property
    def name(self) -> str:
        return f"{self.base_name}+bound:{self.bound_name}"

    @property
    def bound_ratio(self) -> float | None:
        """The real count is at least this count / `bound_ratio` (proxy.core.counting.edge.Bounded)."""
        return self.terms.worst_ratio

    @property
    def identity(self) -> str:
        return f"{self.name}@{self.terms}"

    @property
    def exact(self) -> bool:
        return False

    def _bound(self, text: str, base: int) -> int:
        return math.ceil(self.terms.multiplier * base + class_terms(text, self.terms))

    def count(self, text: str) -> int:
        return self._bound(text, self.base_count(text)) if text else 0

    def count_many(self, texts: list[str]) -> list[int]:
        if self.base_count_many is None:
            return [self.count(t) for t in texts]
        return [self._bound(t, n) if t else 0 for t, n in zip(texts, self.base_count_many(texts), strict=True)]


# A text of at most this many characters is encoded whole; a longer one in slices of at most this.
# Its token list is then at most 4 tokens a character (a character of 4 UTF-8 bytes, each its own
# token) of about 36 bytes each: 1.2 MB at worst, 0.1 MB for prose. Byte-pair encoding of a run of
# random letters costs about 0.25 us a byte at this length (0.5 at 64 KiB, 1.3 at 1 MiB).
SLICE_CHARS = 8 * 1024
# A stretch at least this long with no cut point in it is counted by its UTF-8 bytes.
LONG_RUN_CHARS = SLICE_CHARS // 2
# The UTF-8 length of a long stretch is measured this many characters at a time (a copy each).
_MEASURE_CHARS = 256 * 1024

# Characters a cut may fall before: ASCII whitespace and punctuation (not the apostrophe, which
# starts a contraction), and the common spaces and punctuation of CJK text. Each is checked at
# import to be a space, a punctuation mark, a symbol or a control character.
_CUT_CHARS = (
    ' \t\n\r\x0b\x0c!"#$%&()*+,-./:;<=>?@[\\]^_`{|}~'
    "\u00a0\u3000\u3001\u3002\uff0c\uff0e\uff1a\uff1b\uff01\uff1f\u300c\u300d\u300e\u300f"
    "\u3008\u3009\u300a\u300b\u3010\u3011\uff08\uff09\u2026\u2014\u2013\u00b7\u201c\u201d"
)
assert all(unicodedata.category(c)[0] in "PSZC" and c != "'" for c in _CUT_CHARS), "a cut character is a letter"
_CUT_CLASS = "[" + re.escape(_CUT_CHARS) + "]"
# A cut point: a letter or number (\w less the underscore), then a cut character, matched at the
# latter. Single characters each side: nothing to backtrack over.
_CUT = re.compile(r"(?<=[^\W_])" + _CUT_CLASS)
# The same, read backwards (on a reversed copy): a cut character followed by a letter or number.
_CUT_REVERSED = re.compile(_CUT_CLASS + r"(?=[^\W_])")


class Span(NamedTuple):
    """`text[start:end]`; `exact` when it is to be encoded, else it is counted by its bytes."""

    start: int
    end: int
    exact: bool


def spans(text: str, size: int = SLICE_CHARS) -> Iterator[Span]:
    """Spans covering `text` in order: exact ones of at most `size` characters, cut where the
    count stays exact, and long stretches with no cut point (at least `size // 2` characters)."""
    pos, n, half = 0, len(text), size // 2
    while n - pos > size:
        cut = _CUT.search(text, pos + half, pos + size)  # a cut in the second half of the room
        if cut is not None:
            yield Span(pos, cut.start(), True)
            pos = cut.start()
            continue
        # None from pos + half to pos + size: the last cut in the first half, if any, ends the exact
        # span, and the stretch from it on has none for at least `half` characters.
        start = pos
        window = text[pos + 1 : pos + half + 1][::-1]
        back = _CUT_REVERSED.search(window)
        if back is not None:
            start = pos + half - back.start()
            yield Span(pos, start, True)
        end = _next_cut(text, pos + size)
        yield Span(start, end, False)
        pos = end
    if pos < n:
        yield Span(pos, n, True)


# How far one search for the next cut looks: a stretch with none is crossed in windows, so no one
# call into the regex engine runs long (it holds the GIL, and the event loop waits for it).
_SEARCH_WINDOW = 64 * 1024


def _next_cut(text: str, start: int) -> int:
    """Where the first cut at or after `start` is (the cut is a character: the window's end is
    enough to see it, and the lookbehind sees before the window), else the text's end."""
    n = len(text)
    while start < n:
        end = min(n, start + _SEARCH_WINDOW)
        found = _CUT.search(text, start, end)
        if found is not None:
            return found.start()
        start = end
    return n


def utf8_bytes(text: str, start: int = 0, end: int | None = None) -> int:
    """The UTF-8 length of `text[start:end]` (lone surrogates as 3 bytes, as tiktoken's fix-up
    replaces them with U+FFFD), measured in bounded copies."""
    end = len(text) if end is None else end
    total = 0
    for at in range(start, end, _MEASURE_CHARS):
        piece = text[at : min(end, at + _MEASURE_CHARS)]
        total += len(piece) if piece.isascii() else len(piece.encode("utf-8", "surrogatepass"))
    return total


# A view message's field: the tokens the ciphertext it carries (the encrypted reasoning before a
# Responses item) decodes to at most. Counted with the message, so it goes when the message goes.
CIPHERTEXT_TOKENS = "context_guard_ciphertext_tokens"
# What the note an adapter writes for such a bound says (`Parsed.notes`), for the record to name it.
CIPHERTEXT_NOTE = "encrypted reasoning, an upper bound"


def base64_bytes(text: str) -> int:
    """The most bytes `text` decodes to as base64 (standard or URL-safe, padded or not): every
    four characters that are not padding carry three bytes."""
    return len(text.rstrip("=")) * 3 // 4
