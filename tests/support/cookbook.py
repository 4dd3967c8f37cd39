"""OpenAI's cookbook "How to count tokens with tiktoken": its examples, whose prompt tokens the API
reported, and its counting rule written here with tiktoken directly, so a fake upstream can check
what the guard forwards with a count that shares no code with the guard's own."""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from unittest import mock

import tiktoken

# The OpenAI cookbook's "How to count tokens with tiktoken" examples, with the API's own counts.
COOKBOOK_MESSAGES = [
    {
        "role": "system",
        "content": "You are a helpful, pattern-following assistant that translates corporate jargon into plain English.",
    },
    {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."},
    {"role": "system", "name": "example_assistant", "content": "Things working well together will increase revenue."},
    {
        "role": "system",
        "name": "example_user",
        "content": "Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Let's talk later when we're less busy about how to do better.",
    },
    {
        "role": "user",
        "content": "This late pivot means we don't have time to boil the ocean for the client deliverable.",
    },
]
COOKBOOK_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "description": "Get the current weather in a given location",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                    "unit": {
                        "type": "string",
                        "description": "The unit of temperature to return",
                        "enum": ["celsius", "fahrenheit"],
                    },
                },
                "required": ["location"],
            },
        },
    }
]
COOKBOOK_TOOL_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant that can answer to questions about the weather."},
    {"role": "user", "content": "What's the weather like in San Francisco?"},
]


def encoding(model: str) -> tiktoken.Encoding:
    """tiktoken's own encoding for `model` (o200k_base for a model tiktoken does not know), read from
    the files litellm ships (or `TIKTOKEN_CACHE_DIR`), never downloaded."""
    try:
        name = tiktoken.encoding_name_for_model(model)
    except KeyError:
        name = "o200k_base"
    folder = os.environ.get("TIKTOKEN_CACHE_DIR") or str(_litellm_encodings())
    with mock.patch.dict(os.environ, {"TIKTOKEN_CACHE_DIR": folder}):
        return tiktoken.get_encoding(name)  # kept by tiktoken's registry after the first call


def _litellm_encodings() -> Path:
    spec = importlib.util.find_spec("litellm")  # finds the package without importing it
    assert spec is not None and spec.submodule_search_locations, "litellm (its tiktoken files) is not installed"
    return Path(next(iter(spec.submodule_search_locations))) / "litellm_core_utils" / "tokenizers"


def cookbook_count(body: Mapping[str, Any], extra_texts: Iterable[str] = ()) -> int:
    """The prompt tokens of a chat-completions `body` by the cookbook's rule, with tiktoken directly:
    3 tokens a message, the tokens of each of its values, 1 more for a `name`, and 3 for the reply.
    The cookbook counts plain-text messages only; for the rest this count says what it does:
    a content part's text is counted, a file sent by id counts nothing (the provider reads it; a
    fake adds what it holds), an image is refused (no test needs one counted yet); a value that is
    not text (`tool_calls`), any other part (Anthropic's tool blocks) and each tool's function (or
    the tool itself, Anthropic's) count as their JSON. That JSON counts more than
    OpenAI renders: the cookbook's tools example is 132 tokens against the API's 105 for gpt-4, 131
    against 101 for gpt-4o (`TOOLS_JSON_MARGIN`), so a fake using this count is stricter than the
    provider on tools, never more lenient. `extra_texts` are counted too (Anthropic's
    `system`, a server's own field)."""
    enc = encoding(str(body.get("model") or "gpt-4o"))
    tokens = 3 + sum(len(enc.encode(text)) for text in extra_texts)
    for message in body.get("messages", ()):
        tokens += 3
        for key, value in message.items():
            tokens += _value_tokens(enc, value) + (1 if key == "name" else 0)
    functions = [tool.get("function", tool) for tool in body.get("tools", ())] + list(body.get("functions", ()))
    return tokens + sum(len(enc.encode(json.dumps(function))) for function in functions)


# How far the JSON of the cookbook's tools counts above the API's own count (132 - 105, 131 - 101).
TOOLS_JSON_MARGIN = 30


def _value_tokens(enc: tiktoken.Encoding, value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        return len(enc.encode(value))
    if isinstance(value, list) and all(isinstance(part, dict) and "type" in part for part in value):
        return sum(_part_tokens(enc, part) for part in value)
    return len(enc.encode(json.dumps(value)))


def _part_tokens(enc: tiktoken.Encoding, part: dict[str, Any]) -> int:
    if part["type"] == "text":
        return len(enc.encode(part["text"]))
    if part["type"] == "file":
        return 0
    if "image" in part["type"]:
        raise NotImplementedError(f"the cookbook count does not count a {part['type']!r} part")
    return len(enc.encode(json.dumps(part)))  # an Anthropic tool_use or tool_result block
