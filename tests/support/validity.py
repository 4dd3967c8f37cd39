"""What each API accepts as a valid conversation, checked on the body in its own shape.

The adapters' outputs must pass these whenever their inputs did: no function_call_output or
tool_result without the call it answers, no call left without its output, a Messages
conversation that opens with the user and alternates roles. Tests hold every cut to them (the
guard itself never refuses a request by them: the upstream answers a malformed one).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.apis.cut_positions import content_blocks
from proxy.apis.openai.responses_items import CALL_TYPES, OUTPUT_TYPES


def responses_problems(body: Mapping[str, Any]) -> list[str]:
    """What makes a Responses input invalid to the API: an output whose call is not before it, a
    call with no output after it, a reasoning item with nothing after it."""
    items = body.get("input")
    if not isinstance(items, list):
        return []
    problems: list[str] = []
    open_calls: dict[str, int] = {}
    answered: set[str] = set()
    for k, item in enumerate(items):
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type")
        call_id = item.get("call_id")
        if not isinstance(kind, str) or not isinstance(call_id, str):
            continue
        if kind in OUTPUT_TYPES or kind.endswith("_call_output"):
            if call_id not in open_calls:
                problems.append(f"input[{k}]: output for {call_id!r} has no call before it")
            answered.add(call_id)
        elif kind in CALL_TYPES:
            open_calls[call_id] = k
    problems += [f"input[{k}]: call {c!r} has no output" for c, k in open_calls.items() if c not in answered]
    if items and isinstance(items[-1], Mapping) and items[-1].get("type") == "reasoning":
        problems.append(f"input[{len(items) - 1}]: reasoning item with no item after it")
    return problems


def messages_problems(body: Mapping[str, Any]) -> list[str]:
    """What makes a Messages body invalid to the API: a first message that is not the user's,
    two messages of one role in a row, a tool_result not answering a tool_use of the message just
    before it, a tool_use with no tool_result in the next message, a tool_result after text."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return ["messages is empty"]
    problems: list[str] = []
    if not isinstance(messages[0], Mapping) or messages[0].get("role") != "user":
        problems.append("messages.0: the first message is not a user message")
    previous_uses: set[object] = set()
    previous_role = None
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            continue
        role = message.get("role")
        if role == previous_role:
            problems.append(f"messages.{i}: two {role} messages in a row")
        blocks = content_blocks(message.get("content"))
        results = [b.get("tool_use_id") for b in blocks if isinstance(b, Mapping) and b.get("type") == "tool_result"]
        for tool_use_id in results:
            if tool_use_id not in previous_uses:
                problems.append(f"messages.{i}: tool_result {tool_use_id!r} answers no tool_use just before it")
        missing = previous_uses - set(results)
        if missing and role == "user":
            problems.append(f"messages.{i}: tool_use {sorted(map(str, missing))} have no tool_result here")
        seen_other = False
        for block in blocks:
            if isinstance(block, Mapping) and block.get("type") == "tool_result" and seen_other:
                problems.append(f"messages.{i}: a tool_result comes after other content")
                break
            seen_other = seen_other or not (isinstance(block, Mapping) and block.get("type") == "tool_result")
        previous_uses = (
            {b.get("id") for b in blocks if isinstance(b, Mapping) and b.get("type") == "tool_use"}
            if role == "assistant"
            else set()
        )
        previous_role = role
    return problems
