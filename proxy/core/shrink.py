"""Middle-out shortening of one text to a token target, keeping its head and its tail.

The cut is marked in place with a plain statement of fact, `[... 1,234 tokens removed ...]`,
worded so that it cannot read as an instruction to the model. Only the kept head and tail are
recounted, a few times at most, so shortening a very long text costs little more than counting
what is kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

HEAD_SHARE = 0.6  # the opening of a document or log usually says more than its end, but not all


def marker(removed_tokens: int) -> str:
    return f"[... {removed_tokens:,} tokens removed ...]"


@dataclass(frozen=True, slots=True)
class Shortened:
    text: str
    tokens: int  # tokens of the new text
    removed: int  # tokens of the original text that are gone


def shorten_middle(text: str, tokens: int, target: int, count: Callable[[str], int]) -> Shortened | None:
    """`text` (of `tokens` tokens) cut in the middle to at most `target` tokens, marker included.

    Returns None when the text already fits, or when not even the marker fits in `target`.
    """
    if tokens <= target:
        return None
    marker_cost = count(marker(tokens)) + 2  # and the newlines around it
    room = target - marker_cost
    if room < 0:
        return None
    chars_per_token = len(text) / max(tokens, 1)
    keep_chars = int(room * chars_per_token)
    for _ in range(12):
        head_chars = int(keep_chars * HEAD_SHARE)
        tail_chars = keep_chars - head_chars
        head = text[:head_chars]
        tail = text[len(text) - tail_chars :] if tail_chars else ""
        kept = count(head) + count(tail)
        removed = max(tokens - kept, 1)
        candidate = f"{head}\n{marker(removed)}\n{tail}" if keep_chars else marker(tokens)
        new_tokens = count(candidate)
        if new_tokens <= target:
            return Shortened(candidate, new_tokens, tokens - kept if keep_chars else tokens)
        if keep_chars == 0:
            return None
        # Shrink in proportion to the overshoot, and by at least a tenth, so the loop ends fast.
        keep_chars = min(int(keep_chars * target / new_tokens), int(keep_chars * 0.9))
    final = marker(tokens)
    n = count(final)
    return Shortened(final, n, tokens) if n <= target else None
