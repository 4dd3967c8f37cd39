"""Learning from a provider that still says the context was exceeded, without being fooled.

When an upstream rejects a request we counted as fitting, its error usually says what *it*
counted and what its limit is. `parse_overflow()` reads the templates of OpenAI, vLLM, Vertex
AI, Anthropic and llama.cpp; `Correction.measure()` turns one into a tighter window for that
model (its limit, divided by how far our count fell short of the provider's).

Upstreams echo client text in their errors ("invalid value: <what you sent>"), so a client could
write "maximum context length is 300 tokens" into a field and shrink a model's window for every
client. Three rules stop that:
- the numbers are read only from the provider's own template at the *start* of its error
  message (or from llama.cpp's structured fields), and never when the request we sent contains
  that same sentence;
- a measured limit or factor outside a plausible range of the known window is not believed;
- a correction is remembered only after the retry it produced succeeded (the caller commits it,
  per upstream and model, with an expiry, in `proxy.state.store`), or, when the
  window the provider stated is too small for the request to be retried at all (what may not be
  cut and its output reserve do not fit it), that stated window alone (`Correction.limit_only`),
  which is smaller than the one known.

A client can also make the provider count more than the guard did without writing any sentence:
with a field the guard does not count but the server renders into the prompt (vLLM's
`documents`). The provider's numbers are then true, but the count factor is about that request.
So the window is always measured from the model's known window, never from a correction applied
before (corrections do not compound), and what is remembered for other requests of a request the
adapter did not read whole (`Parsed.read_whole`) is the provider's stated limit alone
(`Correction.limit_only`). The same holds of a request whose count includes an estimate
(`RequestCount.estimated`: a medium whose length or pages are bounded from its size, a part counted
as its JSON): a client chooses what it sends, so a count that falls short on such a part is about
that request (the exchange applies the rule: `proxy.core.exchange`). A correction learned on a
request that opted into a larger window is kept under its own name
(`proxy.core.models.opt_in_windows.correction_key`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

from proxy.core.record_fields import field_dict

# Extra headroom on top of a measured correction, so the retry is not cut to the exact edge.
CORRECTION_HEADROOM = 0.02

# Each template is anchored at the start of the provider's error message.
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # OpenAI: "This model's maximum context length is 8192 tokens. However, your messages resulted in
    # 9000 tokens. Please reduce ..." / "... However, you requested 5000 tokens (4000 in the messages, ...)"
    (
        "openai",
        re.compile(
            r"(?:This model's )?maximum context length is (?P<limit>\d+) tokens\. However, you requested "
            r"\d+ tokens \((?P<prompt>\d+) in the messages"
        ),
    ),
    (
        "openai",
        re.compile(
            r"(?:This model's )?maximum context length is (?P<limit>\d+) tokens\. However, your messages "
            r"resulted in (?P<prompt>\d+) tokens"
        ),
    ),
    # vLLM: "'max_tokens' ... is too large: 1000. This model's maximum context length is 4096 tokens and your
    # request has 3500 input tokens (1000 > 4096 - 3500)."
    (
        "vllm",
        re.compile(
            r"(?:'max_(?:completion_)?tokens' or 'max_(?:completion_)?tokens' is too large: \d+\. )?"
            r"This model's maximum context length is (?P<limit>\d+) tokens and your request has "
            r"(?P<prompt>\d+) input tokens"
        ),
    ),
    # vLLM: "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens ..."
    (
        "vllm",
        re.compile(
            r"This model's maximum context length is (?P<limit>\d+) tokens\. "
            r"However, you requested (?P<total>\d+) tokens"
        ),
    ),
    # Vertex AI / Gemini: "The input token count (2769478) exceeds the maximum number of tokens allowed (1048575)."
    (
        "vertex",
        re.compile(
            r"The input token count \((?P<prompt>\d+)\) exceeds the maximum number of tokens allowed \((?P<limit>\d+)\)"
        ),
    ),
    # Anthropic: "prompt is too long: 210000 tokens > 200000 maximum" (Bedrock relays Claude's after
    # "The model returned the following errors: ")
    (
        "anthropic",
        re.compile(
            r"(?:The model returned the following errors: )?"
            r"prompt is too long: (?P<prompt>\d+) tokens > (?P<limit>\d+) maximum"
        ),
    ),
    # Anthropic, when the input fits but input + max_tokens does not: "input length and `max_tokens`
    # exceed context limit: 199759 + 8192 > 200000, decrease input length or `max_tokens` and try again"
    (
        "anthropic",
        re.compile(r"input length and `max_tokens` exceed context limit: (?P<prompt>\d+) \+ \d+ > (?P<limit>\d+)"),
    ),
)


@dataclass(frozen=True, slots=True)
class Overflow:
    """What a provider said about a request it found too long."""

    provider: str
    limit: int | None  # the provider's context window
    prompt_tokens: int | None  # its count of the prompt, when it gave one
    total_tokens: int | None = None  # prompt + requested completion, when that is all it gave


def parse_overflow(status: int, body: bytes, sent: bytes = b"") -> Overflow | None:
    """The overflow an upstream error response describes, or None if it is some other error or
    its wording could have come from `sent` (the request body we forwarded)."""
    if status not in (400, 413, 422, 500):
        return None
    try:
        data = json.loads(body[:65536].decode("utf-8", "replace"))
    except ValueError:
        return None
    if isinstance(data, list) and data and isinstance(data[0], dict):  # Vertex wraps its errors in a list
        data = data[0]
    error = data.get("error") if isinstance(data, dict) else None
    if isinstance(error, dict) and error.get("type") == "exceed_context_size_error":  # llama.cpp, structured
        return Overflow("llamacpp", _int(error.get("n_ctx")), _int(error.get("n_prompt_tokens")))
    message = error.get("message") if isinstance(error, dict) else None
    if not isinstance(message, str) and isinstance(data, dict):
        message = data.get("message")  # vLLM's {"object": "error", "message": ...}
    if not isinstance(message, str):
        return None
    for provider, pattern in _PATTERNS:
        match = pattern.match(message.lstrip())
        if match is None:
            continue
        if _sent_holds(match.group(0), sent):
            return None  # the sentence was in what the client sent: an echo, not the provider's word
        groups = match.groupdict()
        return Overflow(provider, _int(groups.get("limit")), _int(groups.get("prompt")), _int(groups.get("total")))
    if isinstance(error, dict) and error.get("code") == "context_length_exceeded":
        return Overflow("openai", None, None)
    return None


def _sent_holds(sentence: str, sent: bytes) -> bool:
    """Whether `sent` could have carried `sentence` to an upstream that echoes what it reads: as
    written, JSON-escaped, or spelled with `\\u` escapes the upstream decodes (`\\u0054his model's
    ...`). A body with escapes that does not read as JSON counts as holding it."""
    if sentence.encode() in sent or _json_escaped(sentence) in sent:
        return True
    if b"\\u" not in sent:
        return False
    try:
        written_out = json.dumps(json.loads(sent), ensure_ascii=False).encode("utf-8", "surrogatepass")
    except (ValueError, RecursionError):
        return True
    return sentence.encode() in written_out or _json_escaped(sentence) in written_out


def _json_escaped(text: str) -> bytes:
    return json.dumps(text)[1:-1].encode()


@dataclass(frozen=True, slots=True)
class CorrectionPolicy:
    """What a provider's overflow error must look like to be believed (see the module docstring)."""

    plausible_min_ratio: float = 0.25
    plausible_min_tokens: int = 1024
    max_factor: float = 4.0

# A correction's fields as its log line and the shared store name them, in that order.
_LOGGED_ORDER = ("provider", "limit", "provider_prompt_tokens", "our_prompt_tokens", "factor", "window")
_LOGGED_AS = {"limit": "provider_limit", "window": "corrected_window"}


@dataclass(frozen=True, slots=True)
class Correction:
    """A tighter window for one model on one upstream: `window` replaces the profile's."""

    window: int
    factor: float  # provider count / our count (1.0 when the provider gave no count)
    provider: str
    limit: int | None = None  # the provider's stated window
    provider_prompt_tokens: int | None = None
    our_prompt_tokens: int = 0

    @classmethod
    def measure(
        cls,
        overflow: Overflow,
        our_prompt_tokens: int,
        our_window: int,
        output_reserve: int,
        policy: CorrectionPolicy | None = None,
    ) -> Correction | None:
        """The correction `overflow` implies, or None when it is not plausible: a limit below both
        `plausible_min_ratio` of the window we know and `plausible_min_tokens` (local servers often
        run a model with a window far below its published one, but never a tiny one), or a count
        more than `max_factor` times ours."""
        policy = policy or CorrectionPolicy()
        limit = overflow.limit or our_window
        if limit < min(our_window * policy.plausible_min_ratio, policy.plausible_min_tokens):
            return None
        factor = 1.0
        provider_prompt = overflow.prompt_tokens
        if provider_prompt is None and overflow.total_tokens is not None:
            provider_prompt = overflow.total_tokens - output_reserve
        if provider_prompt is not None and our_prompt_tokens > 0 and provider_prompt > our_prompt_tokens:
            factor = provider_prompt / our_prompt_tokens
        if factor > policy.max_factor:
            return None
        window = math.floor(min(limit, our_window) / (factor * (1 + CORRECTION_HEADROOM)))
        return cls(max(1, window), factor, overflow.provider, overflow.limit, provider_prompt, our_prompt_tokens)

    def limit_only(self, known_window: int) -> Correction | None:
        """What this correction says about the model whatever the request held: the provider's
        stated window (with the headroom), without the count factor; None when it stated none or
        the window known already is no larger."""
        if self.limit is None or self.limit >= known_window:
            return None
        window = math.floor(self.limit / (1 + CORRECTION_HEADROOM))
        return Correction(max(1, window), 1.0, self.provider, self.limit, None, 0)

    def to_dict(self) -> dict[str, object]:
        logged = field_dict(self, _LOGGED_AS, _LOGGED_ORDER)
        logged["factor"] = round(self.factor, 4)  # its place kept: the log's key order is fixed
        return logged

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Correction | None:
        window, factor = data.get("corrected_window"), data.get("factor")
        if not isinstance(window, int) or window < 1 or not isinstance(factor, int | float):
            return None
        return cls(
            window,
            float(factor),
            str(data.get("provider") or "unknown"),
            _int(data.get("provider_limit")),
            _int(data.get("provider_prompt_tokens")),
            _int(data.get("our_prompt_tokens")) or 0,
        )


def _int(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None
