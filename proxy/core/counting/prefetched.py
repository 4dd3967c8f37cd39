"""Tokenizers for counting a request with counts a backend gave beforehand: the pure side of it.

The core counts synchronously; a backend answers over the network. So a request is counted
twice: first with a `RecordingTokenizer` (the local tokenizer, every text it is asked about
remembered), then, once the backend has counted those texts (`proxy.server.backends.tokenize`),
with a `PrefetchedTokenizer` holding the answers. `tool_call_texts` names the texts a template
that drops tool calls never shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.core.counting.tokenizer import Tokenizer


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
