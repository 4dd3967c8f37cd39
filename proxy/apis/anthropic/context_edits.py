"""Anthropic's context edits (`context_management.edits`, beta `context-management-2025-06-27`)
applied to a Messages body as the provider applies them before the prompt reaches the model.

    clear_thinking_20251015    keep: {"type": "thinking_turns", "value": N} (default N = 1), or
                               "all" / {"type": "all"}: the thinking blocks of every assistant
                               turn but the last N that hold any are removed
    clear_tool_uses_20250919   trigger: {"type": "input_tokens" | "tool_uses", "value"} (default
                               100,000 input tokens): once the prompt exceeds it, the oldest tool
                               results are replaced by a placeholder, all but the newest `keep`
                               ({"type": "tool_uses", "value"}, default 3), never those of a tool
                               named in `exclude_tools`; `clear_tool_inputs` (true, or tool names)
                               empties those calls' inputs too; with `clear_at_least`
                               ({"type": "input_tokens", "value"}) nothing is cleared unless that
                               many tokens can be

Edits run in the order given (Anthropic requires clear_thinking first), each on what the one
before left. Where Anthropic's documentation leaves a choice open, the reading here is the one
that clears less, so that a count made after these edits is never below the provider's: an
assistant turn runs from one user message that is not only tool results to the next (fewer,
longer turns keep more thinking), and tool uses of an excluded tool do not count towards `keep`.
Anthropic does not publish the text that replaces a cleared result; `CLEARED` stands for it.

What each edit cleared is reported as Anthropic reports it (`context_management.applied_edits`):
`{"type", "cleared_tool_uses" | "cleared_thinking_turns", "cleared_input_tokens"}`, an edit that
cleared nothing left out. Every function here is pure; the sizes come from the caller's tokenizer.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from proxy.apis.base import InvalidRequest

CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"
BETA = "context-management-2025-06-27"  # the `anthropic-beta` flag the edits need
CLEARED = "[Tool result cleared to save context]"
DEFAULT_TRIGGER_TOKENS = 100_000
DEFAULT_KEEP_TOOL_USES = 3
DEFAULT_KEEP_THINKING_TURNS = 1
_THINKING_BLOCKS = frozenset({"thinking", "redacted_thinking"})

Sizes = Callable[[str], int]  # the tokens of a text, by the request's tokenizer


@dataclass(frozen=True, slots=True)
class TokenSizes:
    """A text's tokens at most and at least (the same for an exact count, or one the guard acts
    on itself). Thinking cleared before a token trigger is taken at its most (the trigger then
    fires later), what clearing tool results frees at its least (`clear_at_least` then holds later)."""

    most: Sizes
    least: Sizes


@dataclass(frozen=True, slots=True)
class ClearThinking:
    keep: int | None  # the newest assistant turns whose thinking stays; None: all of it


@dataclass(frozen=True, slots=True)
class ClearToolUses:
    trigger_tokens: int | None  # exceeded by the prompt's input tokens, the edit runs
    trigger_uses: int | None  # exceeded by the number of tool uses, the edit runs
    keep: int
    clear_at_least: int
    exclude: frozenset[str]
    inputs: bool | frozenset[str]  # whose inputs are emptied too: every tool's (True) or these


Edit = ClearThinking | ClearToolUses


@dataclass(frozen=True, slots=True)
class Edited:
    """A body once the edits ran: the new body (the one given when nothing was cleared) and what
    each edit cleared, in Anthropic's words."""

    body: Mapping[str, Any]
    applied: tuple[dict[str, Any], ...]


def requested_edits(body: Mapping[str, Any]) -> tuple[Edit, ...]:
    """The edits `body.context_management` asks for, checked; other kinds of edit (compaction)
    are not this module's and are left out. A malformed one is refused naming its field."""
    management = body.get("context_management")
    if management is None:
        return ()
    if not isinstance(management, Mapping):
        raise InvalidRequest("context_management: must be an object", param="context_management")
    edits = management.get("edits")
    if edits is None:
        return ()
    if not isinstance(edits, list):
        raise InvalidRequest("context_management.edits: must be an array", param="context_management.edits")
    out: list[Edit] = []
    for i, edit in enumerate(edits):
        where = f"context_management.edits.{i}"
        if not isinstance(edit, Mapping) or not isinstance(edit.get("type"), str):
            raise InvalidRequest(f"{where}: must be an object with a 'type'", param=where)
        if edit["type"] == CLEAR_THINKING:
            out.append(_clear_thinking(edit, where))
        elif edit["type"] == CLEAR_TOOL_USES:
            out.append(_clear_tool_uses(edit, where))
    return tuple(out)


def apply_edits(
    body: Mapping[str, Any], edits: Sequence[Edit], input_tokens: Callable[[], int], sizes: TokenSizes
) -> Edited:
    """`body` as the provider will see it after `edits`. `input_tokens()` is the prompt's count
    before them, asked only when a token trigger needs it (the caller gives the least the provider
    can count, so that an edit is assumed to run only when it surely does)."""
    messages: list[Any] = list(body.get("messages") or ())
    applied: list[dict[str, Any]] = []
    for edit in edits:
        if isinstance(edit, ClearThinking):
            report = _cleared_thinking(messages, edit, sizes.most)
        else:
            cleared = sum(int(r["cleared_input_tokens"]) for r in applied)
            report = _cleared_tool_uses(messages, edit, partial(_less, input_tokens, cleared), sizes.least)
        if report is not None:
            applied.append(report)
    if not applied:
        return Edited(body, ())
    return Edited({**body, "messages": messages}, tuple(applied))


def _less(tokens: Callable[[], int], cleared: int) -> int:
    return tokens() - cleared


def without_edits(body: Mapping[str, Any]) -> dict[str, Any]:
    """`body` for an upstream that does not edit: the edits this module applies taken out of
    `context_management`, the field dropped when nothing else is left in it."""
    out = dict(body)
    management = out.get("context_management")
    if not isinstance(management, Mapping):
        out.pop("context_management", None)
        return out
    edits = management.get("edits")
    edits = edits if isinstance(edits, list) else []
    rest = [e for e in edits if not (isinstance(e, Mapping) and e.get("type") in _OURS)]
    kept = {k: v for k, v in management.items() if k != "edits"}
    if rest:
        kept["edits"] = rest
    if kept:
        out["context_management"] = kept
    else:
        del out["context_management"]
    return out


def without_beta(value: str) -> str:
    """An `anthropic-beta` header's value less the context-management flag."""
    return ",".join(flag for flag in (f.strip() for f in value.split(",")) if flag and flag != BETA)


_OURS = frozenset({CLEAR_THINKING, CLEAR_TOOL_USES})


# -- reading the edits ------------------------------------------------------------------------


def _count(value: object, kinds: tuple[str, ...], where: str) -> tuple[str, int]:
    """A `{"type": kind, "value": n}` object's kind and non-negative integer value."""
    if not isinstance(value, Mapping) or value.get("type") not in kinds:
        raise InvalidRequest(f"{where}: must be an object with 'type' one of {', '.join(kinds)}", param=where)
    number = value.get("value")
    if not isinstance(number, int) or isinstance(number, bool) or number < 0:
        raise InvalidRequest(f"{where}.value: must be a non-negative integer", param=f"{where}.value")
    return str(value["type"]), number


def _clear_thinking(edit: Mapping[str, Any], where: str) -> ClearThinking:
    keep = edit.get("keep")
    if keep is None:
        return ClearThinking(DEFAULT_KEEP_THINKING_TURNS)
    if keep == "all" or (isinstance(keep, Mapping) and keep.get("type") == "all"):
        return ClearThinking(None)
    _, turns = _count(keep, ("thinking_turns",), f"{where}.keep")
    if turns < 1:
        raise InvalidRequest(f"{where}.keep.value: must be at least 1", param=f"{where}.keep.value")
    return ClearThinking(turns)


def _clear_tool_uses(edit: Mapping[str, Any], where: str) -> ClearToolUses:
    trigger_tokens: int | None = DEFAULT_TRIGGER_TOKENS
    trigger_uses: int | None = None
    if edit.get("trigger") is not None:
        kind, value = _count(edit["trigger"], ("input_tokens", "tool_uses"), f"{where}.trigger")
        trigger_tokens, trigger_uses = (value, None) if kind == "input_tokens" else (None, value)
    keep = DEFAULT_KEEP_TOOL_USES
    if edit.get("keep") is not None:
        keep = _count(edit["keep"], ("tool_uses",), f"{where}.keep")[1]
    at_least = 0
    if edit.get("clear_at_least") is not None:
        at_least = _count(edit["clear_at_least"], ("input_tokens",), f"{where}.clear_at_least")[1]
    return ClearToolUses(
        trigger_tokens,
        trigger_uses,
        keep,
        at_least,
        _names(edit.get("exclude_tools"), f"{where}.exclude_tools"),
        _inputs(edit.get("clear_tool_inputs"), f"{where}.clear_tool_inputs"),
    )


def _names(value: object, where: str) -> frozenset[str]:
    if value is None:
        return frozenset()
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise InvalidRequest(f"{where}: must be an array of tool names", param=where)
    return frozenset(value)


def _inputs(value: object, where: str) -> bool | frozenset[str]:
    if value is None or isinstance(value, bool):
        return bool(value)
    return _names(value, where)


# -- applying them ----------------------------------------------------------------------------


def _turns(messages: Sequence[Any]) -> list[list[int]]:
    """The assistant messages of each assistant turn, oldest first: a turn ends at a user message
    that is not only tool results."""
    turns: list[list[int]] = [[]]
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            continue
        if message.get("role") == "assistant":
            turns[-1].append(i)
        elif not _only_tool_results(message.get("content")) and turns[-1]:
            turns.append([])
    return [turn for turn in turns if turn]


def _only_tool_results(content: object) -> bool:
    return isinstance(content, list) and bool(content) and all(
        isinstance(b, Mapping) and b.get("type") == "tool_result" for b in content
    )


def _cleared_thinking(messages: list[Any], edit: ClearThinking, sizes: Sizes) -> dict[str, Any] | None:
    if edit.keep is None:
        return None
    thinking = [turn for turn in _turns(messages) if any(_thinking_blocks(messages[i]) for i in turn)]
    cleared_turns = cleared_tokens = 0
    for turn in thinking[: max(0, len(thinking) - edit.keep)]:
        cleared = False
        for i in turn:
            content = messages[i]["content"]
            kept = [b for b in content if not (isinstance(b, Mapping) and b.get("type") in _THINKING_BLOCKS)]
            if not kept or len(kept) == len(content):  # a message of thinking alone is left as it is
                continue
            cleared_tokens += sum(sizes(str(b.get("thinking", ""))) for b in _thinking_blocks(messages[i]))
            messages[i] = {**messages[i], "content": kept}
            cleared = True
        cleared_turns += cleared
    if not cleared_turns:
        return None
    return {"type": CLEAR_THINKING, "cleared_thinking_turns": cleared_turns, "cleared_input_tokens": cleared_tokens}


def _thinking_blocks(message: object) -> list[Mapping[str, Any]]:
    content = message.get("content") if isinstance(message, Mapping) else None
    if not isinstance(content, list):
        return []
    return [b for b in content if isinstance(b, Mapping) and b.get("type") in _THINKING_BLOCKS]


@dataclass(frozen=True, slots=True)
class _ToolUse:
    at: tuple[int, int]  # the message and block of the tool_use
    id: str
    name: str


def _tool_uses(messages: Sequence[Any]) -> list[_ToolUse]:
    uses = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") != "assistant":
            continue
        content = message.get("content")
        for j, block in enumerate(content if isinstance(content, list) else ()):
            if isinstance(block, Mapping) and block.get("type") == "tool_use" and isinstance(block.get("id"), str):
                uses.append(_ToolUse((i, j), block["id"], str(block.get("name", ""))))
    return uses


def _results(messages: Sequence[Any]) -> dict[str, list[tuple[int, int]]]:
    """Where each tool_use id is answered: the message and block of its tool_result(s)."""
    found: dict[str, list[tuple[int, int]]] = {}
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or message.get("role") != "user":
            continue
        content = message.get("content")
        for j, block in enumerate(content if isinstance(content, list) else ()):
            if isinstance(block, Mapping) and block.get("type") == "tool_result":
                found.setdefault(str(block.get("tool_use_id")), []).append((i, j))
    return found


def _cleared_tool_uses(
    messages: list[Any], edit: ClearToolUses, input_tokens: Callable[[], int], sizes: Sizes
) -> dict[str, Any] | None:
    uses = _tool_uses(messages)
    clearable = [use for use in uses if use.name not in edit.exclude]
    candidates = clearable[: max(0, len(clearable) - edit.keep)]
    if not candidates:
        return None
    runs = (edit.trigger_uses is not None and len(uses) > edit.trigger_uses) or (
        edit.trigger_tokens is not None and input_tokens() > edit.trigger_tokens
    )
    if not runs:
        return None
    results = _results(messages)
    placeholder = sizes(CLEARED)
    changes: dict[tuple[int, int], dict[str, Any]] = {}
    cleared_uses = cleared_tokens = 0
    for use in candidates:
        freed, before = 0, len(changes)
        for i, j in results.get(use.id, ()):
            block = messages[i]["content"][j]
            freed += max(0, _text_tokens(block.get("content"), sizes) - placeholder)
            changes[(i, j)] = {**block, "content": CLEARED}
        if edit.inputs is True or (isinstance(edit.inputs, frozenset) and use.name in edit.inputs):
            i, j = use.at
            block = messages[i]["content"][j]
            freed += max(0, sizes(json.dumps(block.get("input", {}), ensure_ascii=False)) - sizes("{}"))
            changes[use.at] = {**block, "input": {}}
        if len(changes) > before:
            cleared_uses += 1
            cleared_tokens += freed
    if not cleared_uses or cleared_tokens < edit.clear_at_least:
        return None
    by_message: dict[int, list[tuple[int, dict[str, Any]]]] = {}
    for (i, j), block in changes.items():
        by_message.setdefault(i, []).append((j, block))
    for i, blocks in by_message.items():
        content = list(messages[i]["content"])
        for j, block in blocks:
            content[j] = block
        messages[i] = {**messages[i], "content": content}
    return {"type": CLEAR_TOOL_USES, "cleared_tool_uses": cleared_uses, "cleared_input_tokens": cleared_tokens}


def _text_tokens(content: object, sizes: Sizes) -> int:
    """The tokens of a tool result's text (its other blocks, images, not counted: what clearing
    frees is taken at its least)."""
    if isinstance(content, str):
        return sizes(content)
    if not isinstance(content, list):
        return 0
    return sum(sizes(b["text"]) for b in content if isinstance(b, Mapping) and isinstance(b.get("text"), str))
