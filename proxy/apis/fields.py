"""What a body holds that the guard does not count: the top-level fields each API shape's adapter
accounts for (those it counts, and those known to stay out of the prompt: sampling options,
output settings, metadata), and the parts it cannot see (`unseen_parts`, below).

Any other field is forwarded untouched, as always, but the guard cannot say what it adds to the
prompt: vLLM passes `chat_template_kwargs` to the template, the Responses API adds the
conversation `previous_response_id` names (vLLM's `documents` are counted, as their JSON; a
client's own `chat_template`, which renders anything at all, is refused in enforce mode unless
the operator forwards it: `refuse_client_template`). So what the upstream says about such a
request (a count in an overflow error, `usage.prompt_tokens`) is about that request alone: it
may correct that request's own retry, but it is never taken as a fact about the model for other
clients' requests (a correction's count factor, a calibration ratio). A field missing from these
lists costs only that: the lists err on the side of not learning.

What a reading of a body already knew before its adapter parses it (`KnownPrefix`) is here too:
the elements an earlier, accepted body with the same bytes already had checked, and looked through
for unseen parts; the adapters skip those. The prefix reader (`proxy.wire.prefix_reader`) fills it
in; the adapters only read it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

from proxy.errors import HTTPRefusal


@dataclass(frozen=True)
class KnownPrefix:
    """What a reading knew of the body's array before parsing it: its first `checked` elements
    came from an earlier body that the same adapter accepted, and `hashes[i]` identifies element
    i by its bytes (every element, when the array was located; otherwise empty)."""

    checked: int = 0
    hashes: tuple[int, ...] = ()
    # Every top-level key but the array's holds the value an earlier body held, read from the same
    # bytes: an adapter that accepted that body need not check those keys again.
    others_known: bool = False
    # The body is byte for byte an earlier one, which this object stands for (an identity only):
    # what was worked out for those bytes holds for these.
    same: object | None = None
    # Its first `seen_whole` elements hold no part whose content the guard cannot see: the earlier
    # body's whole view had none (`unseen_parts`), so they are not looked through again.
    seen_whole: int = 0


NOTHING_KNOWN = KnownPrefix()


UNREAD_SHOWN = 8  # names kept for the log; one is enough to say the request was not read whole

# Options of the OpenAI-style APIs that never reach the prompt, and those of the servers that
# speak them (vLLM, llama.cpp, Ollama): sampling, decoding constraints, output and bookkeeping.
_SAMPLING = frozenset(
    {
        "model", "stream", "stream_options", "temperature", "top_p", "n", "stop", "seed", "user",
        "frequency_penalty", "presence_penalty", "logit_bias", "logprobs", "top_logprobs", "metadata",
        "store", "service_tier", "safety_identifier", "prompt_cache_key", "background",
        # vLLM
        "best_of", "use_beam_search", "top_k", "min_p", "repetition_penalty", "length_penalty",
        "stop_token_ids", "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens",
        "spaces_between_special_tokens", "truncate_prompt_tokens", "prompt_logprobs", "allowed_token_ids",
        "bad_words", "guided_json", "guided_regex", "guided_choice", "guided_grammar",
        "guided_decoding_backend", "guided_whitespace_pattern", "structured_outputs", "priority",
        "request_id", "return_tokens_as_token_ids", "return_token_ids", "cache_salt", "logits_processors",
        "vllm_xargs", "kv_transfer_params",
        # llama.cpp's server
        "n_predict", "typical_p", "tfs_z", "repeat_penalty", "repeat_last_n", "penalize_nl", "mirostat",
        "mirostat_tau", "mirostat_eta", "grammar", "json_schema", "n_probs", "min_keep", "cache_prompt",
        "samplers", "dynatemp_range", "dynatemp_exponent", "xtc_probability", "xtc_threshold",
        "dry_multiplier", "dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers",
        "id_slot", "t_max_predict_ms", "return_tokens", "timings_per_token", "post_sampling_probs",
        "reasoning_format", "lora",
        # Ollama
        "keep_alive", "options", "format", "think",
    }
)  # fmt: skip

CHAT = _SAMPLING | {
    "messages", "tools", "tool_choice", "functions", "function_call", "response_format", "max_tokens",
    "max_completion_tokens", "parallel_tool_calls", "reasoning_effort", "verbosity", "modalities", "audio",
    "prediction", "documents",  # counted as their JSON (`RequestCounter`)
}  # fmt: skip
COMPLETIONS = _SAMPLING | {"prompt", "max_tokens", "echo", "suffix", "best_of"}
RESPONSES = _SAMPLING | {
    "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
    "max_tool_calls", "reasoning", "text", "truncation", "include",
}  # fmt: skip
MESSAGES = frozenset(
    {
        "model", "messages", "system", "max_tokens", "tools", "tool_choice", "stream", "temperature",
        "top_k", "top_p", "stop_sequences", "metadata", "thinking", "service_tier", "output_format",
        "anthropic_version", "context_management",
    }
)  # fmt: skip

# Gemini's generateContent (camelCase and the snake_case proto JSON also takes).
GEMINI = frozenset(
    {
        "contents", "systemInstruction", "system_instruction", "tools", "toolConfig", "tool_config",
        "generationConfig", "generation_config", "safetySettings", "safety_settings", "cachedContent",
        "cached_content", "labels", "model", "serviceTier", "service_tier", "store",
    }
)  # fmt: skip


# Where a body hands the server a prompt template of the client's own: vLLM renders a request's
# `chat_template` (or `chat_template_kwargs.chat_template`, which it takes the same way) in place
# of the model's. It may put any text at all into the prompt, beyond what the guard counts, so in
# enforce mode such a request is refused unless `trim.client_templates: forward`.
def client_template(body: Mapping[str, Any]) -> str | None:
    """Where `body` carries a template of the client's own (a null one is none), else None."""
    if body.get("chat_template") is not None:
        return "chat_template"
    kwargs = body.get("chat_template_kwargs")
    if isinstance(kwargs, Mapping) and kwargs.get("chat_template") is not None:
        return "chat_template_kwargs.chat_template"
    return None


def refuse_client_template(body: Mapping[str, Any]) -> None:
    """400 for a body that carries a template of the client's own."""
    where = client_template(body)
    if where is not None:
        raise HTTPRefusal(
            f"context-guard counts the prompt as the model's own template renders it; a request's own "
            f"`{where}` can render any text at all, which it cannot count. Send the request without it, "
            "or ask the operator to allow it (trim.client_templates: forward)",
            400,
            code="client_template_refused",
            param=where,
        )


def unread_fields(body: Mapping[str, Any], accounted: frozenset[str]) -> tuple[str, ...]:
    """The first few top-level fields of `body` outside `accounted` (names cut short for the log)."""
    return tuple(name[:64] for name in islice((k for k in body if k not in accounted), UNREAD_SHOWN))


# Parts of a request the guard cannot see, whatever the API shape: what they cost is neither
# counted nor bounded, so what the upstream says about such a request (its overflow error's count,
# its usage) is about that request and must not be learned for the model.
#
# A part is unseen when the provider reads content the body does not carry and the count gives it
# no upper bound: a file sent by `file_id` or URL (counted as 0), audio without its data, a document
# an Anthropic request names by file id or URL. An image by URL is not unseen: it is priced at the
# most an image can cost. The walk looks only at list contents (a string content has no parts), so
# it costs a step per message and per part: 13 us for a re-sent 88 KB conversation of 96 messages.
# (Searching the body's bytes for the type values first cost 275 us on that body: JSON is dense in
# the quotes and backslashes such a search stops at.)
# Most parts named, for the log: a request with thousands says so with the first few.
NAMED_AT_MOST = 8


def unseen_parts(messages: Sequence[Any], start: int = 0) -> tuple[str, ...]:
    """Where the parts of the chat view's `messages` that the guard cannot see are
    (`messages[3].content[1]: file by id`), at most `NAMED_AT_MOST` of them; the messages before
    `start` are known to hold none."""
    found: list[str] = []
    for i in range(start, len(messages)):
        message = messages[i]
        # The view's messages are dicts: the concrete type is checked before the ABC (a tenth of the cost).
        content = message.get("content") if type(message) is dict or isinstance(message, Mapping) else None
        if type(content) is not list:
            continue
        for j, part in enumerate(content):
            if type(part) is dict and part.get("type") in _SEEN:
                continue
            why = _unseen(part)
            if why is not None:
                found.append(f"messages[{i}].content[{j}]: {why}")
                if len(found) >= NAMED_AT_MOST:
                    return tuple(found)
    return tuple(found)


# Part types that are always read whole: a text, an image priced at the most an image can cost.
_SEEN = frozenset({"text", "image_url"})


def _unseen(part: object) -> str | None:
    if not isinstance(part, Mapping):
        return None
    kind = part.get("type")
    if kind in _SEEN:
        return None
    if kind == "file":
        spec = part.get("file")
        return None if isinstance(spec, Mapping) and isinstance(spec.get("file_data"), str) else "file by id or URL"
    if kind == "input_audio":
        spec = part.get("input_audio")
        return None if isinstance(spec, Mapping) and isinstance(spec.get("data"), str) else "audio without its data"
    if kind == "item":  # an adapter's opaque part, counted as its JSON
        item = part.get("item")
        if isinstance(item, Mapping) and item.get("type") == "document":  # Anthropic's, by reference
            source = item.get("source")
            if isinstance(source, Mapping) and source.get("type") in ("file", "url"):
                return "document by file id or URL"
    return None
