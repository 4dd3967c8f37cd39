"""Message roles as counting and trimming see them: which are pinned (never cut), which are tool
results, and which user message is the latest."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

PINNED_ROLES = frozenset({"system", "developer"})
TOOL_RESULT_ROLES = frozenset({"tool", "function"})


def latest_user_index(messages: Sequence[Any]) -> int | None:
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if isinstance(message, Mapping) and message.get("role") == "user":
            return i
    return None
