"""Where a trim's changes land in the original list an adapter renders (`messages`, `contents`,
`input`): the entries dropped whole or in part, and the positions of the notes the trim added.
Shared by the adapters whose view messages come from parts of the client's entries (Anthropic's
blocks, Gemini's parts, Responses' items), so each renders the same cut the same way."""

from __future__ import annotations

from proxy.apis.base import Changes, Parsed


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
