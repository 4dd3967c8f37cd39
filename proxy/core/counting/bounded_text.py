"""The note of what a request's counting bounded instead of encoding.

`EncoderTokenizer` (`proxy.core.counting.tokenizer`) counts a stretch of text by an upper bound when it
cannot be cut where the count stays exact, or when the native encoder fails on it. The counter
(`proxy.core.counting.request_count`) wants to say so on the request's record, but the tokenizer is called
deep inside counting with no request in hand: a ContextVar carries the record for the counting of
one request, in its thread or task, and nothing else. Its own module, so the tokenizers and the
counter share the note without either owning the other's job.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from dataclasses import dataclass, field


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
