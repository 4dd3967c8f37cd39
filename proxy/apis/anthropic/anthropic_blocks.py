"""Anthropic Messages content read into the core's chat view: the system prompt and each message,
block by block (`read_system`, `read_message`).

The newest compaction block that holds a summary (server-side compaction, `compact_20260112`) is
where Anthropic starts reading: "the API drops all message blocks prior to the compaction block".
What precedes it is checked and left out of the view (`read_messages`), the block goes in as a
pinned compaction marker (`proxy.core.trimming.compaction`), and a cut request drops what
preceded it first (`drop_before_compaction`): the provider would not have read it anyway.

A user message's tool_result blocks become tool messages answering their tool_use id, ahead of a
user message holding its other blocks; an assistant message's tool_use blocks become tool_calls
and its thinking `reasoning_content`; images, documents and server tool results become the
parts the core counts (an unknown block as its JSON). Every view message and part records the
message and block it came from, which is all the adapter needs to write a cut back.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from proxy.apis.base import InvalidRequest, Origin, Parsed, ViewBuilder, opaque_part, text_part
from proxy.core.costs.images import ANTHROPIC_IMAGE_SIDE_MOST, side_over
from proxy.core.trimming.turns import MARKER
from proxy.core.work_budget import BLOCK_UNITS, spend

ROLES = frozenset({"user", "assistant"})


def read_system(system: object, view: ViewBuilder) -> None:
    """The `system` field (a string or text blocks) as a pinned system message, when it holds any."""
    if system is None or system == "":
        return
    if isinstance(system, str):
        view.add({"role": "system", "content": system}, (Origin("system"),))
        return
    if not isinstance(system, list):
        raise InvalidRequest("system: must be a string or an array of text blocks", param="system")
    spend(BLOCK_UNITS * len(system))
    parts = []
    for j, block in enumerate(system):
        if not isinstance(block, Mapping) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise InvalidRequest(f"system.{j}: must be a text block", param=f"system.{j}")
        parts.append(text_part(block["text"]))
    view.add({"role": "system", "content": parts}, (Origin("system"),), tuple(range(len(parts))))


def compaction_start(messages: Sequence[object]) -> tuple[int, int] | None:
    """Where the provider starts reading `messages`: the message and block of the newest compaction
    block with a summary (one whose `content` is null is a failed compaction, which Anthropic
    treats as a no-op); None without one."""
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        if not isinstance(message, Mapping) or message.get("role") != "assistant":
            continue
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for j in range(len(content) - 1, -1, -1):
            block = content[j]
            if _is_summary(block):
                return i, j
    return None


def _is_summary(block: object) -> bool:
    return isinstance(block, Mapping) and block.get("type") == "compaction" and isinstance(block.get("content"), str)


def read_messages(messages: Sequence[object], view: ViewBuilder) -> None:
    """Every message checked, and those from the newest compaction block on added to the view."""
    start = compaction_start(messages)
    first = 0
    if start is not None:
        first, block = start
        checked = ViewBuilder()  # what precedes the block is checked as the provider checks it, not counted
        for i in range(first):
            read_message(messages[i], i, checked)
        dropped = f"{first} messages" + (f" and {block} blocks" if block else "")
        view.notes.append(
            f"messages.{first}.content.{block}: a compaction block, where the provider starts reading: the "
            f"{dropped} before it are not counted, and go first when the request is cut"
        )
    for i in range(first, len(messages)):
        read_message(messages[i], i, view, start[1] if start is not None and i == first else None)


def drop_before_compaction(parsed: Parsed, whole: set[int], blocks: dict[int, set[int]]) -> None:
    """Add what precedes the compaction block (`read_messages`) to the messages and blocks a cut
    drops (`proxy.apis.cut_positions.dropped_origins`)."""
    start = compaction_start(parsed.body["messages"])
    if start is None:
        return
    first, block = start
    whole.update(range(first))
    if block:
        blocks.setdefault(first, set()).update(range(block))


def read_message(message: object, i: int, view: ViewBuilder, marker: int | None = None) -> None:
    """`messages[i]` checked and added to the view, as one message or (with tool results) several;
    an assistant message from its compaction block `marker` on."""
    where = f"messages.{i}"
    if not isinstance(message, Mapping):
        raise InvalidRequest(f"{where}: must be an object", param=where)
    role = message.get("role")
    if role not in ROLES:
        raise InvalidRequest(f"{where}.role: must be 'user' or 'assistant'", param=f"{where}.role")
    content = message.get("content")
    if isinstance(content, str):
        view.add({"role": role, "content": content}, (Origin("messages", i),))
        return
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}.content: must be a string or an array of blocks", param=f"{where}.content")
    spend(BLOCK_UNITS * len(content))
    for j, block in enumerate(content):
        if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
            raise InvalidRequest(f"{where}.content.{j}: must be a block with a 'type'", param=f"{where}.content.{j}")
    if role == "assistant":
        _assistant(content, i, view, marker)
    else:
        _user(content, i, view)


def _user(content: list[Mapping[str, Any]], i: int, view: ViewBuilder) -> None:
    others: list[int] = []
    for j, block in enumerate(content):
        if block["type"] != "tool_result":
            others.append(j)
            continue
        tool_use_id = block.get("tool_use_id")
        if not isinstance(tool_use_id, str):
            where = f"messages.{i}.content.{j}.tool_use_id"
            raise InvalidRequest(f"{where}: is required", param=where)
        inner = block.get("content")
        if isinstance(inner, list):
            result: Any
            result, parts = _blocks(inner, range(len(inner)), view, f"messages.{i}.content.{j}.content")
        else:
            result, parts = (inner if isinstance(inner, str) else ""), ()
        view.add({"role": "tool", "tool_call_id": tool_use_id, "content": result}, (Origin("messages", i, j),), parts)
    if len(others) == len(content):
        parts_list, mapping = _blocks(content, others, view, f"messages.{i}.content")
        view.add({"role": "user", "content": parts_list}, (Origin("messages", i),), mapping)
    elif others:
        parts_list, mapping = _blocks(content, others, view, f"messages.{i}.content")
        view.add({"role": "user", "content": parts_list}, tuple(Origin("messages", i, j) for j in others), mapping)


def _assistant(content: list[Mapping[str, Any]], i: int, view: ViewBuilder, marker: int | None = None) -> None:
    parts: list[dict[str, Any]] = []
    mapping: list[int | None] = []
    calls: list[dict[str, Any]] = []
    thinking: list[str] = []
    first = 0
    if marker is not None:  # the compaction block, pinned; the blocks before it are not read
        block = content[marker]
        view.add({"role": "system", "content": block["content"], MARKER: True}, (Origin("messages", i, marker),))
        if block.get("encrypted_content"):
            view.estimate(f"messages.{i}.content.{marker}: the compaction block's encrypted_content is not counted")
        first = marker + 1
        if first == len(content):
            return
    for j in range(first, len(content)):
        block = content[j]
        kind = block["type"]
        if kind == "tool_use":
            arguments = json.dumps(block.get("input", {}), ensure_ascii=False, default=str)
            function = {"name": str(block.get("name", "")), "arguments": arguments}
            calls.append({"id": block.get("id"), "type": "function", "function": function})
        elif kind == "thinking":
            if isinstance(block.get("thinking"), str):
                thinking.append(block["thinking"])
        elif kind == "redacted_thinking":
            view.estimate(f"messages.{i}.content.{j}: redacted thinking is not counted")
        else:
            shown, places = _blocks(content, (j,), view, f"messages.{i}.content")
            parts += shown
            mapping += places
    message: dict[str, Any] = {"role": "assistant", "content": parts or None}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["reasoning_content"] = "\n".join(thinking)
    # After a compaction block, the message's own blocks: a cut of it keeps the block.
    blocks = tuple(Origin("messages", i, j) for j in range(first, len(content)))
    view.add(message, (Origin("messages", i),) if marker is None else blocks, tuple(mapping))


def _blocks(
    blocks: Sequence[Mapping[str, Any]], indices: Iterable[int], view: ViewBuilder, where: str
) -> tuple[list[dict[str, Any]], tuple[int | None, ...]]:
    """The view parts of `blocks[j]` for each j of `indices`, and the block each part came from.
    A document's `title` and `context` are shown to the model with it: they follow its part as
    one part of their own, counted as their JSON and never shortened or written back (None)."""
    parts: list[dict[str, Any]] = []
    mapping: list[int | None] = []
    for j in indices:
        block = blocks[j]
        part = _block(block, view, f"{where}.{j}")
        parts.append(part)
        mapping.append(j)
        if block.get("type") == "document" and part.get("type") != "item":  # an opaque part holds them already
            shown = {key: block[key] for key in ("title", "context") if isinstance(block.get(key), str) and block[key]}
            if shown:
                parts.append(opaque_part(shown))
                mapping.append(None)
    return parts, tuple(mapping)


def _block(block: Mapping[str, Any], view: ViewBuilder, where: str) -> dict[str, Any]:
    kind = block.get("type")
    if kind == "text":
        text = block.get("text")
        if not isinstance(text, str):
            raise InvalidRequest(f"{where}.text: must be a string", param=f"{where}.text")
        return text_part(text)
    source = block.get("source")
    source = source if isinstance(source, Mapping) else {}
    if kind == "image":
        url = _source_url(source)
        if side_over(url, ANTHROPIC_IMAGE_SIDE_MOST) is not None:  # refused as Anthropic refuses it
            most = ANTHROPIC_IMAGE_SIDE_MOST
            message = f"At least one of the image dimensions exceed max allowed size: {most} pixels"
            raise InvalidRequest(f"{where}.source.base64.data: {message}", param=f"{where}.source")
        return {"type": "image_url", "image_url": {"url": url, "detail": "auto"}}
    if kind == "document":
        if source.get("type") == "text" and isinstance(source.get("data"), str):
            return text_part(source["data"])
        if source.get("type") == "base64" and isinstance(source.get("data"), str):
            return {"type": "file", "file": {"file_data": _source_url(source)}}
        view.estimate(f"{where}: document by reference or as blocks, counted as its JSON")
    elif isinstance(kind, str) and kind.endswith("_tool_result"):  # a server tool's: web search, fetch, ...
        view.estimate(f"{where}: {kind} counted as its JSON; what its encrypted content stands for is not visible")
    return opaque_part(dict(block))


def _source_url(source: Mapping[str, Any]) -> str:
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        return f"data:{source.get('media_type', 'application/octet-stream')};base64,{source['data']}"
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return str(source["url"])
    return ""  # a file id: priced at the most an image can cost
