"""Middle-out shortening of one text (and of one message of a request being trimmed) to a token
target, keeping its head and its tail.

The cut is marked in place with a plain statement of fact, `[... 1,234 tokens removed ...]`,
worded so that it cannot read as an instruction to the model. Only the kept head and tail are
recounted, a few times at most, so shortening a very long text costs little more than counting
what is kept.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from proxy.core.trimming.trim import TrimState

IMAGE_MARKER = "[image removed]"
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


def shorten_message(state: TrimState, index: int, target: int, strategy: str) -> None:
    """Shorten message `index` to about `target` tokens by cutting its text (a string content or
    its largest text parts) in the middle. Leaves it alone when it holds no text worth cutting."""
    message = state.messages[index]
    if not isinstance(message, Mapping):
        return
    counter = state.counter
    content = message.get("content")
    excess = state.counts[index] - target
    if isinstance(content, str):
        tokens = counter.text(content)
        cut = shorten_middle(content, tokens, max(0, tokens - excess), counter.text)
        if cut is not None:
            state.replace(index, {**message, "content": cut.text}, "truncated", strategy, content)
        return
    if not isinstance(content, list):
        return
    parts = list(content)
    texts = sorted(
        ((counter.text(p["text"]), j) for j, p in enumerate(parts) if _is_text(p)),
        reverse=True,
    )
    changed = False
    for tokens, j in texts:
        if excess <= 0:
            break
        cut = shorten_middle(parts[j]["text"], tokens, max(0, tokens - excess), counter.text)
        if cut is None:
            continue
        parts[j] = {**parts[j], "text": cut.text}
        excess -= tokens - cut.tokens
        changed = True
    if changed:
        state.replace(index, {**message, "content": parts}, "truncated", strategy, content)


def has_text(message: object) -> bool:
    """Whether `message` holds text that `shorten_message` can cut."""
    if not isinstance(message, Mapping):
        return False
    content = message.get("content")
    return isinstance(content, str) or (isinstance(content, list) and any(_is_text(p) for p in content))


def _is_text(part: object) -> bool:
    return isinstance(part, Mapping) and part.get("type") == "text" and isinstance(part.get("text"), str)


def is_image(part: object) -> bool:
    return isinstance(part, Mapping) and part.get("type") == "image_url"


def without_images(message: Mapping[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """`message` with each image part replaced by a text marker, and the parts removed."""
    content = message.get("content")
    parts = content if isinstance(content, list) else []
    new_content = [{"type": "text", "text": IMAGE_MARKER} if is_image(p) else p for p in parts]
    return {**message, "content": new_content}, [p for p in parts if is_image(p)]
