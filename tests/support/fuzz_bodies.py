"""Hypothesis strategies for the fuzz tests: a valid chat body with arbitrary JSON values thrown at
its fields, at every depth the core reads, including ones the core never sees."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import strategies as st

BASE: dict[str, Any] = {
    "model": "gpt-4o",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in this image? " * 20},
                {"type": "image_url", "image_url": {"url": "https://example.com/cat.png", "detail": "low"}},
            ],
            "name": "ada",
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "look", "arguments": '{"q": 1}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a cat " * 30},
        {"role": "user", "content": "And now?"},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "look",
                "description": "Looks.",
                "parameters": {"type": "object", "properties": {"q": {"type": "integer", "enum": [1, 2]}}},
            },
        }
    ],
    "tool_choice": {"type": "function", "function": {"name": "look"}},
    "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
    "max_tokens": 100,
}
EXTRA_TOP_LEVEL = ["functions", "function_call", "max_completion_tokens", "stream", "n", "stop", "unknown_field"]
EXTRA_IN_MESSAGE = ["name", "function_call", "refusal", "tool_call_id", "audio"]
KNOWN_KEYS = ["role", "content", "type", "text", "function", "name", "arguments", "tool_calls", "image_url", "url"]


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    paths = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, item in value.items():
            paths += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            paths += _paths(item, (*prefix, index))
    return paths


LOCATIONS: list[tuple[Any, ...]] = (
    [(), *_paths(BASE)]
    + [(key,) for key in EXTRA_TOP_LEVEL]
    + [("messages", i, key) for i in range(len(BASE["messages"])) for key in EXTRA_IN_MESSAGE]
)
LONE_SURROGATES = ["\ud800", "x\udfffy", "\udc00"]


def nested(depth: int) -> Any:
    value: Any = "deep"
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.sampled_from([10**23, -1, 0, 2**31, 2**63, 2**64 + 1])
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
    | st.sampled_from(LONE_SURROGATES)
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(KNOWN_KEYS) | st.text(max_size=6), children, max_size=4)
    ),
    max_leaves=16,
) | st.integers(min_value=30, max_value=400).map(nested)


def put(body: Any, path: tuple[Any, ...], value: Any) -> Any:
    """`body` with `value` at `path` (the whole body for the empty path); a path through a value
    that an earlier replacement turned into something else leaves the body as it is."""
    if not path:
        return value
    target = body
    try:
        for step in path[:-1]:
            target = target[step]
        if isinstance(target, dict) or (isinstance(target, list) and path[-1] < len(target)):
            target[path[-1]] = value
    except (KeyError, IndexError, TypeError):
        pass
    return body


@st.composite
def fuzzed_bodies(draw: st.DrawFn) -> bytes:
    """A chat body, as bytes, with one to three fields replaced by arbitrary JSON values."""
    body: Any = copy.deepcopy(BASE)
    body["model"] = draw(st.sampled_from(["gpt-4o", "tiny-model"]))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        body = put(body, draw(st.sampled_from(LOCATIONS)), draw(json_values))
    # ensure_ascii: lone surrogates become \\udXXX escapes, as a client's JSON library would write them.
    return json.dumps(body, ensure_ascii=True).encode()
