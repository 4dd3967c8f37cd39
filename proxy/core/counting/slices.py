"""Where a long text may be cut so that its slices, encoded one by one, count exactly what the
whole would; and a bound for the stretches that cannot be cut.

Encoding a whole text materialises its token list (12-45x the text in memory: Python ints in a
list) and gives byte-pair encoding one pre-token as long as the longest run of letters, on which
it is superlinear. Counting slices of at most `SLICE_CHARS` characters bounds both.

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
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from typing import NamedTuple

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
