"""Where a trim's changes land in the original list an adapter renders (`messages`, `contents`,
`input`): the entries dropped whole or in part, and the positions of the notes the trim added.
Shared by the adapters whose view messages come from parts of the client's entries (Anthropic's
blocks, Gemini's parts, Responses' items), so each renders the same cut the same way."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from proxy.apis.base import Changes, Parsed, text_part


def dropped_origins(parsed: Parsed, changes: Changes, list_field: str) -> tuple[set[int], dict[int, set[int]]]:
    """The entries of `list_field` the trim dropped whole, and, by entry, the blocks (parts) it
    dropped from the entries it kept."""
    whole: set[int] = set()
    blocks: dict[int, set[int]] = {}
    for i in changes.dropped:
        for origin in parsed.sources[i].origins:
            if origin.field != list_field or origin.index is None:
                continue
            if origin.block is None:
                whole.add(origin.index)
            else:
                blocks.setdefault(origin.index, set()).add(origin.block)
    return whole, blocks


def inserted_texts(parsed: Parsed, changes: Changes, list_field: str, end: int) -> dict[int, list[str]]:
    """The texts of the messages the trim added (the budget note, a summary), by the position in
    the original `list_field` (`input`, `messages`) of the item each goes before; `end` when it
    goes last."""
    before: dict[int, list[str]] = {}
    for view_index, message in changes.inserted:
        position = end
        if view_index < len(parsed.sources):
            origin = next((o for o in parsed.sources[view_index].origins if o.field == list_field), None)
            position = origin.index if origin is not None and origin.index is not None else end
        content = message.get("content")
        before.setdefault(position, []).append(content if isinstance(content, str) else "")
    return before


def alternating(
    messages: list[Any],
    whole: set[int],
    blocks: dict[int, set[int]],
    notes: dict[int, list[str]],
    note_block: Callable[[str], dict[str, Any]],
) -> list[Any]:
    """The messages of a user/assistant API (Anthropic's, Bedrock's Converse) after a cut: those
    dropped `whole` gone, the `blocks` dropped from the others gone (a message left with none goes
    too), each note (`inserted_texts`) a user message of `note_block`s before the message at its
    position, and two messages of one role that a drop or a note left side by side joined into one,
    so roles still alternate and the conversation still opens as it did."""
    kept: list[tuple[int, dict[str, Any]]] = []
    for k, message in enumerate([*messages, None]):
        if k in notes:
            note = {"role": "user", "content": [note_block(text) for text in notes[k]]}
            if kept and kept[-1][1].get("role") == "user":
                kept[-1] = (-1, _join(kept[-1][1], note))
            else:
                kept.append((-1, note))
        if message is None or k in whole:
            continue
        if k in blocks:
            content = [b for j, b in enumerate(message["content"]) if j not in blocks[k]]
            if not content:
                continue
            message = {**message, "content": content}
        if kept and kept[-1][0] != k - 1 and kept[-1][1].get("role") == message.get("role"):
            kept[-1] = (k, _join(kept[-1][1], message))
        else:
            kept.append((k, message))
    return [m for _, m in kept]


def _join(first: Mapping[str, Any], second: Mapping[str, Any]) -> dict[str, Any]:
    return {**first, "content": content_blocks(first.get("content")) + content_blocks(second.get("content"))}


def content_blocks(content: object) -> list[Any]:
    """A message's content as a list of blocks (Anthropic's string content as one text block)."""
    if isinstance(content, str):
        return [text_part(content)] if content else []
    return list(content) if isinstance(content, list) else []
