"""Learning from a provider that still says the context was exceeded.

When an upstream rejects a request we counted as fitting, its error usually says what *it*
counted and what its limit is. `parse_overflow()` reads the formats of OpenAI, vLLM, Vertex AI
and llama.cpp; `Correction` turns one into a tighter window for that model (its limit, divided
by how far our count fell short of the provider's), and `CorrectionMemory` remembers it per
model so later requests are cut right the first time.
"""

from __future__ import annotations

import json
import math
import re
from collections import OrderedDict
from dataclasses import dataclass

# Extra headroom on top of a measured correction, so the retry is not cut to the exact edge.
CORRECTION_HEADROOM = 0.02

_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # OpenAI and vLLM: "maximum context length is 8192 tokens. However, your messages resulted in
    # 9000 tokens" / "However, you requested 5000 tokens (4000 in the messages, 1000 in the completion)"
    ("openai", re.compile(r"maximum context length is (?P<limit>\d+) tokens.*?(?P<prompt>\d+) in the messages", re.S)),
    (
        "openai",
        re.compile(
            r"maximum context length is (?P<limit>\d+) tokens.*?messages resulted in (?P<prompt>\d+) tokens", re.S
        ),
    ),
    # vLLM (newer): "maximum context length is 4096 tokens and your request has 3500 input tokens"
    (
        "vllm",
        re.compile(r"maximum context length is (?P<limit>\d+) tokens and your request has (?P<prompt>\d+) input", re.S),
    ),
    # vLLM (prompt alone too long): "... maximum context length is 4096 tokens. However, you requested 5000 tokens"
    ("vllm", re.compile(r"maximum context length is (?P<limit>\d+) tokens.*?requested (?P<total>\d+) tokens", re.S)),
    # Vertex AI / Gemini: "The input token count (2769478) exceeds the maximum number of tokens allowed (1048575)"
    (
        "vertex",
        re.compile(
            r"input token count \((?P<prompt>\d+)\) exceeds the maximum number of tokens allowed \((?P<limit>\d+)\)"
        ),
    ),
    # Anthropic through an OpenAI-compatible layer: "prompt is too long: 210000 tokens > 200000 maximum"
    ("anthropic", re.compile(r"prompt is too long: (?P<prompt>\d+) tokens > (?P<limit>\d+) maximum")),
    # Bare forms: "maximum context length is 4096 tokens"
    ("generic", re.compile(r"(?:maximum context length|context window) (?:is|of) (?P<limit>\d+) tokens")),
)


@dataclass(frozen=True, slots=True)
class Overflow:
    """What a provider said about a request it found too long."""

    provider: str
    limit: int | None  # the provider's context window
    prompt_tokens: int | None  # its count of the prompt, when it gave one
    total_tokens: int | None = None  # prompt + requested completion, when that is all it gave


def parse_overflow(status: int, body: bytes) -> Overflow | None:
    """The overflow an error response describes, or None if it is some other error."""
    if status not in (400, 413, 422, 500):
        return None
    text = body[:65536].decode("utf-8", "replace")
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and error.get("type") == "exceed_context_size_error":  # llama.cpp
        return Overflow("llama.cpp", _int(error.get("n_ctx")), _int(error.get("n_prompt_tokens")))
    if isinstance(error, list) and error:  # Vertex sometimes wraps errors in a list
        error = error[0].get("error") if isinstance(error[0], dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    haystack = message if isinstance(message, str) else text
    for provider, pattern in _PATTERNS:
        match = pattern.search(haystack)
        if match:
            groups = match.groupdict()
            return Overflow(provider, _int(groups.get("limit")), _int(groups.get("prompt")), _int(groups.get("total")))
    if isinstance(error, dict) and error.get("code") == "context_length_exceeded":
        return Overflow("openai", None, None)
    return None


@dataclass(frozen=True, slots=True)
class Correction:
    """A tighter window for one model: `window` replaces the profile's."""

    window: int
    factor: float  # provider count / our count (1.0 when the provider gave no count)
    provider: str

    @classmethod
    def measure(cls, overflow: Overflow, our_prompt_tokens: int, our_window: int, output_reserve: int) -> Correction:
        limit = overflow.limit or our_window
        factor = 1.0
        provider_prompt = overflow.prompt_tokens
        if provider_prompt is None and overflow.total_tokens is not None:
            provider_prompt = overflow.total_tokens - output_reserve
        if provider_prompt is not None and our_prompt_tokens > 0 and provider_prompt > our_prompt_tokens:
            factor = provider_prompt / our_prompt_tokens
        window = math.floor(min(limit, our_window) / (factor * (1 + CORRECTION_HEADROOM)))
        return cls(window=max(1, window), factor=factor, provider=overflow.provider)

    def tighter(self, other: Correction | None) -> Correction:
        return self if other is None or self.window <= other.window else other


class CorrectionMemory:
    """The latest correction per model, for at most `max_models` models (least recent forgotten)."""

    def __init__(self, max_models: int = 1024) -> None:
        self.max_models = max_models
        self._entries: OrderedDict[str, Correction] = OrderedDict()

    def get(self, model: str) -> Correction | None:
        correction = self._entries.get(model)
        if correction is not None:
            self._entries.move_to_end(model)
        return correction

    def remember(self, model: str, correction: Correction) -> Correction:
        kept = correction.tighter(self._entries.get(model))
        self._entries[model] = kept
        self._entries.move_to_end(model)
        while len(self._entries) > self.max_models:
            self._entries.popitem(last=False)
        return kept


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None
