"""`bound:<name>` tokenizers: an upper bound (proxy.core.counting.bound) over a tiktoken encoding's count.

The base count is an `EncoderTokenizer`'s, so a bound tokenizer (Claude, Gemini, Gemma, unknown
names) counts through the same path as an exact one: work budget, slices, one token per byte
where no cut is found, fallback on a native panic, cancellation checkpoints (docs/security.md)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields, replace
from typing import TYPE_CHECKING

from proxy.core.counting.bound import BOUNDS, BoundTerms, BoundTokenizer
from proxy.core.counting.tokenizer import EncoderTokenizer

if TYPE_CHECKING:
    import tiktoken

BOUND_BASE = "cl100k_base"  # the encoding every bound scales


class UnknownBound(ValueError):
    pass


def bound_terms(name: str, multiplier: float = 1.0) -> BoundTerms:
    """Bound `name`'s terms, each scaled by a configured multiplier (`bound:open*1.1`)."""
    terms = BOUNDS.get(name)
    if terms is None:
        raise UnknownBound(f"unknown bound {name!r}; known: {', '.join(sorted(BOUNDS))}")
    if multiplier == 1.0:
        return terms
    scaled = {f.name: value * multiplier for f in fields(terms) if (value := getattr(terms, f.name)) is not None}
    return replace(terms, **scaled)  # the worst ratio too: a bound m times larger is at most m times further above


def bound_tokenizer(
    name: str,
    multiplier: float,
    encoding: tiktoken.Encoding,
    batch: Callable[[list[str]], list[list[int]]],
    batch_from_chars: int = 0,
) -> BoundTokenizer:
    """Bound `name` over `encoding` (`batch` encodes many texts at once, as the shell spreads them,
    from `batch_from_chars` characters on: `EncoderTokenizer`)."""
    base = EncoderTokenizer(BOUND_BASE, encoding.encode_ordinary, encode_batch=batch, batch_from_chars=batch_from_chars)
    return BoundTokenizer(
        BOUND_BASE,
        base.count,
        bound_terms(name, multiplier),
        name if multiplier == 1.0 else f"{name}x{multiplier:g}",
        base.count_many,
    )
