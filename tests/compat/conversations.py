"""What the suite sends, and its checks of what arrived: written without the guard's code (tiktoken
counts the text directly), so that a counting error in the guard could not hide itself."""

from __future__ import annotations

import functools
import json
import os
from typing import Any

import tiktoken

from proxy.tokenizers.vocabularies import bundled_encodings_dir

TURNS = 60
HUGE = "word " * 9000  # a system prompt no cut can make fit a 4,096-token window (it is pinned)
OVERFLOW = [{"role": "system", "content": HUGE}, {"role": "user", "content": "hi"}]


@functools.cache
def _encoding() -> tiktoken.Encoding:
    """o200k_base by tiktoken itself, from the copy litellm ships (no download)."""
    os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(bundled_encodings_dir()))
    return tiktoken.get_encoding("o200k_base")


def tokens(value: Any) -> int:
    """Tokens of every string in `value` (no framing): a floor of what the model is sent."""
    if isinstance(value, str):
        return len(_encoding().encode(value, disallowed_special=()))
    if isinstance(value, dict):
        return sum(tokens(v) for v in value.values())
    if isinstance(value, list):
        return sum(tokens(v) for v in value)
    return 0


def chat_history(turns: int = TURNS) -> list[dict[str, Any]]:
    """A long agent conversation in chat-completions form: questions, tool calls and their results."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a weather agent."}]
    for i in range(turns):
        call = {
            "id": f"call_{i}",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
        messages += [
            {"role": "user", "content": f"Question {i}: what is the weather in Paris today, in detail?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{i}", "content": f"Result {i}: " + "sunny and mild " * 12},
            {"role": "assistant", "content": f"Answer {i}: " + "it is sunny and mild " * 6},
        ]
    messages.append({"role": "user", "content": "And tomorrow?"})
    return messages


def responses_history(turns: int = TURNS) -> list[dict[str, Any]]:
    """The same conversation as Responses input items."""
    items: list[dict[str, Any]] = []
    for i in range(turns):
        items += [
            {"role": "user", "content": f"Question {i}: what is the weather in Paris today, in detail?"},
            {"type": "function_call", "call_id": f"call_{i}", "name": "get_weather", "arguments": '{"city": "Paris"}'},
            {
                "type": "function_call_output",
                "call_id": f"call_{i}",
                "output": f"Result {i}: " + "sunny and mild " * 12,
            },
            {"role": "assistant", "content": f"Answer {i}: " + "it is sunny and mild " * 6},
        ]
    items.append({"role": "user", "content": "And tomorrow?"})
    return items


def anthropic_history(turns: int = TURNS) -> list[dict[str, Any]]:
    """The same conversation as Anthropic messages (tool_use and tool_result blocks)."""
    messages: list[dict[str, Any]] = []
    for i in range(turns):
        use = {"type": "tool_use", "id": f"toolu_{i}", "name": "get_weather", "input": {"city": "Paris"}}
        result = {
            "type": "tool_result",
            "tool_use_id": f"toolu_{i}",
            "content": f"Result {i}: " + "sunny and mild " * 12,
        }
        messages += [
            {"role": "user", "content": f"Question {i}: what is the weather in Paris today, in detail?"},
            {"role": "assistant", "content": [use]},
            {"role": "user", "content": [result]},
            {"role": "assistant", "content": f"Answer {i}: " + "it is sunny and mild " * 6},
        ]
    messages.append({"role": "user", "content": "And tomorrow?"})
    return messages


def chat_pairs_intact(messages: list[dict[str, Any]]) -> bool:
    """Every tool result follows the assistant message that called it, and every call has its result."""
    open_calls: set[str] = set()
    for message in messages:
        if message.get("role") == "assistant":
            if open_calls:
                return False
            open_calls = {c["id"] for c in message.get("tool_calls") or []}
        elif message.get("role") == "tool":
            if message.get("tool_call_id") not in open_calls:
                return False
            open_calls.discard(message["tool_call_id"])
        elif open_calls:
            return False
    return not open_calls


def responses_pairs_intact(items: list[dict[str, Any]]) -> bool:
    """Every function_call has its output after it, and every output its call before it."""
    calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
    outputs = [i["call_id"] for i in items if i.get("type") == "function_call_output"]
    if sorted(calls) != sorted(outputs):
        return False
    return all(_position(items, "function_call", c) < _position(items, "function_call_output", c) for c in calls)


def _position(items: list[dict[str, Any]], kind: str, call_id: str) -> int:
    return next(i for i, item in enumerate(items) if item.get("type") == kind and item.get("call_id") == call_id)


def anthropic_pairs_intact(messages: list[dict[str, Any]]) -> bool:
    """Each tool_result answers a tool_use of the assistant message just before it, and each
    tool_use is answered in the next message."""
    for i, message in enumerate(messages):
        blocks = message["content"] if isinstance(message["content"], list) else []
        uses = {b["id"] for b in blocks if isinstance(b, dict) and b.get("type") == "tool_use"}
        results = {b["tool_use_id"] for b in blocks if isinstance(b, dict) and b.get("type") == "tool_result"}
        if results:
            before = messages[i - 1]["content"] if i else []
            called = (
                {b["id"] for b in before if isinstance(b, dict) and b.get("type") == "tool_use"}
                if isinstance(before, list)
                else set()
            )
            if not results <= called:
                return False
        if uses:
            after = messages[i + 1]["content"] if i + 1 < len(messages) else []
            answered = (
                {b.get("tool_use_id") for b in after if isinstance(b, dict)} if isinstance(after, list) else set()
            )
            if not uses <= answered:
                return False
    return True


def arguments(text: str) -> dict[str, Any]:
    return json.loads(text)
