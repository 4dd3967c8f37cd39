"""A small chat body with every part a count call renders: a system prompt, content parts, a tool
call and its result, tool definitions and a forced tool choice."""

from __future__ import annotations

from typing import Any

CHAT: dict[str, Any] = {
    "model": "m",
    "max_tokens": 100,
    "temperature": 0.2,
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
    ],
    "tools": [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}],
    "tool_choice": {"type": "function", "function": {"name": "weather"}},
}
