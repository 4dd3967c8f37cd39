"""Upper bounds of a token count where the model's own tokenizer does not ship (Claude's current
one, Gemini's and Gemma's, Llama 2's, unknown models).

A bound is a real encoding's count (cl100k_base) scaled by a multiplier, plus a term per text class
that costs more in other vocabularies than in cl100k: digits (cl100k writes three to a token;
SentencePiece vocabularies one each), newlines and runs of spaces or tabs (SentencePiece
vocabularies fall back to one token per newline byte), and scripts that cl100k encodes more
cheaply than some vocabularies do (Thai, Arabic; other non-ASCII characters such as emoji).

The terms were fitted to the corpus in tests/data/families (every text class: prose in eleven
languages, code, JSON, CSV, logs, hex, UUIDs, base64, digits, whitespace runs, emoji) against every
real vocabulary that ships offline, then rounded up; tests/core/models/test_families_bounds.py proves
them never under on that corpus, and bench/families.py writes the ratios to docs/benchmarks.md.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

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
