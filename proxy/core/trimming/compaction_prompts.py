"""Compaction as the client shows it: a request that asks to compact, and a history that starts at
a compaction marker.

**A compaction marker** is where the provider starts reading the conversation (Anthropic's
`compaction` block, the Responses `compaction` item): the adapter leaves out of the view what
precedes it (the provider drops it) and puts the marker in as a pinned message flagged
`MARKER` (true), which no strategy shortens. **A compaction trigger** (Codex's
`compaction_trigger` item, the synthetic end of a `/v1/responses/compact` request) is a view
message flagged `TRIGGER`: its request is a compaction request whatever its text. The flags are
booleans, which the count does not read.

**A client's own compaction request** is also recognised by its latest user message.

Agent clients compact their history themselves when it grows too long: they send the whole
conversation once more with an instruction to summarise it, and replace the history with the
answer. Cutting that request's history leaves the summary without material (the task is lost),
so the trimming strategies treat it apart (`proxy.core.trimming.clearing`). The prompts recognised:

- Claude Code: "Your task is to create a detailed summary of the conversation so far ...", and (2.1)
  "... of this conversation. This summary will be placed at the start of a continuing session"
  and, for a partial compaction, "... of the RECENT portion of the conversation"
- Codex CLI: "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary for
  another LLM that will resume the task." (and its older "write a summary/memento ... for the next
  agent" family)
- gemini-cli: its latest user message asks to "generate the <state_snapshot>" (the instruction
  itself goes as the system instruction)
- generic: "summarize (or summarise) the/this/our conversation (so far)", "compact the conversation"

and any regular expression the operator adds (`clear_tool_results.compaction_patterns`). Matching
is case-insensitive, over the message's text, and only its first 4,000 characters are read: the
instruction is short and comes first, while the same words deep inside pasted material are not a
request to compact.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from typing import Any

MARKER = "context_guard_compaction_marker"
TRIGGER = "context_guard_compaction_trigger"

BUILT_IN = (
    r"create a detailed summary of (?:the conversation so far|this conversation|the recent portion of the conv)",
    r"context checkpoint compaction",
    r"create a handoff summary for another llm",
    r"\bsummari[sz]e (?:the|this|our) (?:entire |whole )?(?:conversation|chat|session)\b",
    r"\bcompact (?:the|this|our) (?:conversation|chat|session|context)\b",
    r"\b(?:summary|memento)\b[^.]{0,80}\bfor the next agent\b",
    r"generate the <state_snapshot>",
)
READ_CHARS = 4000


@lru_cache(maxsize=64)
def compiled_patterns(extra: tuple[str, ...] = ()) -> re.Pattern[str]:
    """The built-in prompts and `extra` as one expression; ValueError naming a bad one."""
    for pattern in extra:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"compaction pattern {pattern!r} is not a regular expression: {exc}") from None
    return re.compile("|".join(f"(?:{p})" for p in (*BUILT_IN, *extra)), re.IGNORECASE)


def is_compaction_request(messages: Sequence[Any], protected: Iterable[int], extra: tuple[str, ...] = ()) -> bool:
    """Whether the latest user message (the first user message of the `protected` tail) asks
    to summarise the conversation, or the tail holds a compaction trigger."""
    latest = next((i for i in protected if _role(messages[i]) == "user"), None)
    if latest is None:
        return False
    if any(is_flagged(messages[i], TRIGGER) for i in protected):
        return True
    text = _text(messages[latest])[:READ_CHARS]
    return bool(text) and compiled_patterns(extra).search(text) is not None


def is_flagged(message: object, flag: str) -> bool:
    """Whether a view message carries `flag` (`MARKER`, `TRIGGER`)."""
    return isinstance(message, Mapping) and message.get(flag) is True


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = (p.get("text") for p in content if isinstance(p, Mapping))
    return "\n".join(t for t in parts if isinstance(t, str))


def _role(message: object) -> str | None:
    role = message.get("role") if isinstance(message, Mapping) else None
    return role if isinstance(role, str) else None
