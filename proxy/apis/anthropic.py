"""Anthropic Messages (`POST /v1/messages`, `/v1/messages/count_tokens`) as the core's chat view.

    system (string or text blocks)     -> a system message (pinned)
    user message                       -> its tool_result blocks first, one tool message each
                                          (answering the tool_use id), then a user message with
                                          the other blocks (text, image, document, ...)
    assistant message                  -> an assistant message: text blocks as text parts,
                                          tool_use blocks as tool_calls, thinking as
                                          `reasoning_content` (counted, never cut), other blocks
                                          counted as their JSON
    image                              -> an image part priced by Anthropic's published rule
                                          (width x height / 750 after fitting 1568 px, at most
                                          1,600 tokens), whatever the model's family
    tools                              -> chat function tools (input_schema as parameters,
                                          input_examples as their JSON with the description);
                                          server tools counted as their JSON; the tool-use system
                                          prompt Anthropic adds is counted from its published sizes
    max_tokens                         -> max_tokens (the output reserve)

A tool_use and the tool_result answering it are one atomic unit for the core even though they
sit in different messages. Rendering drops and shortens blocks in place, then joins any two
messages of one role that a drop left side by side, so roles still alternate and the
conversation still opens with a user message. A message the trim added (the budget note, a
summary) becomes a text block opening the user message after the dropped ones. Errors take Anthropic's shape,
`{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar

from proxy.apis import fields
from proxy.apis.base import (
    Adapter,
    Changes,
    InvalidRequest,
    Origin,
    Parsed,
    Source,
    ViewBuilder,
    changed_parts,
    inserted_texts,
    optional_model,
    output_reserve,
    part_text,
    require_object,
    stream_flag,
    text_part,
)
from proxy.apis.fields import unread_fields
from proxy.apis.known import NOTHING_KNOWN, KnownPrefix
from proxy.apis.responses import opaque_part
from proxy.core.images import AreaCost
from proxy.core.models import ModelProfile

ROLES = frozenset({"user", "assistant"})
ANTHROPIC_IMAGES = AreaCost(pixels_per_token=750, max_long_side=1568, max_tokens=1600)

# The system prompt Anthropic adds when `tools` are given, by model and tool_choice (auto/none,
# any/tool), from its tool-use pricing table. Unknown models get the largest of each column.
TOOL_PROMPT_TOKENS: tuple[tuple[str, int, int], ...] = (
    ("claude-3-opus*", 530, 281),
    ("claude-3-sonnet*", 159, 235),
    ("claude-3-haiku*", 264, 340),
    ("claude-3-5-haiku*", 264, 340),
    ("claude-3-5-sonnet*", 346, 313),
    ("claude-3-7-sonnet*", 346, 313),
    ("claude-*-4*", 346, 313),
    ("claude-4*", 346, 313),
)
TOOL_PROMPT_UNKNOWN = (530, 340)
# Anthropic-defined tools add their own published prompt tokens on top (computer use: the tool's
# 735 and its system prompt's 499 at most); other server tools are counted as their JSON.
SERVER_TOOL_TOKENS: tuple[tuple[str, int], ...] = (("bash_", 245), ("text_editor_", 700), ("computer_", 735 + 499))

# Anthropic's error type per HTTP status (its SDKs raise by status, and read `error.type`).
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "api_error",
    529: "overloaded_error",
}


def tool_prompt_tokens(model: str | None, tool_choice: object) -> int:
    forced = isinstance(tool_choice, Mapping) and tool_choice.get("type") in ("any", "tool")
    name = (model or "").lower().rsplit("/", 1)[-1]
    for pattern, auto, forced_tokens in TOOL_PROMPT_TOKENS:
        if fnmatch.fnmatchcase(name, pattern):
            return forced_tokens if forced else auto
    return TOOL_PROMPT_UNKNOWN[1] if forced else TOOL_PROMPT_UNKNOWN[0]


def count_tokens_body(input_tokens: int) -> dict[str, int]:
    """The answer of `/v1/messages/count_tokens`."""
    return {"input_tokens": input_tokens}


class MessagesAdapter(Adapter):
    name: ClassVar[str] = "messages"
    writes_inserted: ClassVar[bool] = True
    requires_max_tokens: ClassVar[bool] = True
    resent_array: ClassVar[str | None] = "messages"

    def parse(self, body: object, known: KnownPrefix = NOTHING_KNOWN) -> Parsed:
        body = require_object(body)
        model = optional_model(body, required=False)
        view = ViewBuilder()
        _system(body.get("system"), view)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise InvalidRequest("messages: a non-empty array is required", param="messages")
        for i, message in enumerate(messages):
            _message(message, i, view)
        chat: dict[str, Any] = {"messages": view.messages}
        if model is not None:
            chat["model"] = model
        tools, fixed = _tools(body.get("tools"), view)
        if tools:
            chat["tools"] = tools
            fixed += tool_prompt_tokens(model, body.get("tool_choice"))
        if isinstance(body.get("tool_choice"), Mapping):
            chat["tool_choice"] = body["tool_choice"]
        reserve = output_reserve(body, "max_tokens", required=self.requires_max_tokens)
        if reserve is not None:
            chat["max_tokens"] = reserve
        schema = body.get("output_format")
        if isinstance(schema, Mapping) and schema.get("type") == "json_schema":
            chat["response_format"] = {"type": "json_schema", "json_schema": {"schema": schema.get("schema")}}
        return Parsed(
            api=self.name,
            body=body,
            chat=chat,
            sources=tuple(view.sources),
            model=model,
            stream=stream_flag(body),
            exact=view.exact,
            fixed_tokens=fixed,
            notes=tuple(view.notes),
            reserve_field="max_tokens",
            reserve_view_field="max_tokens",
            unread=unread_fields(body, fields.MESSAGES),
        )

    def profile(self, profile: ModelProfile, parsed: Parsed) -> ModelProfile:
        """Images are priced by Anthropic's rule on this API, whatever the model's family."""
        return super().profile(replace(profile, images=ANTHROPIC_IMAGES), parsed)

    def error_body(self, status: int, error_type: str, message: str, param: str | None = None) -> dict[str, Any]:
        kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": f"{param}: {message}" if param else message}}

    def _render(self, parsed: Parsed, changes: Changes) -> dict[str, Any]:
        body = dict(parsed.body)
        messages: list[Any] = list(body["messages"])
        for i, new in changes.replaced.items():
            _write_back(body, messages, parsed.sources[i], parsed.messages[i], new)
        whole: set[int] = set()
        blocks: dict[int, set[int]] = {}
        for i in changes.dropped:
            for origin in parsed.sources[i].origins:
                if origin.field != "messages" or origin.index is None:
                    continue
                if origin.block is None:
                    whole.add(origin.index)
                else:
                    blocks.setdefault(origin.index, set()).add(origin.block)
        # Anthropic has no system messages among the turns: each message the trim added (the budget
        # note, a summary) is a text block opening the user message after the dropped ones.
        notes = inserted_texts(parsed, changes, "messages", len(messages))
        kept: list[tuple[int, dict[str, Any]]] = []
        for k, message in enumerate([*messages, None]):
            if k in notes:  # a user message of its own, joined with the user messages around it
                note = {"role": "user", "content": [text_part(text) for text in notes[k]]}
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
                # A drop (or a note) left two messages of one role side by side: join them.
                kept[-1] = (k, _join(kept[-1][1], message))
            else:
                kept.append((k, message))
        body["messages"] = [m for _, m in kept]
        return body


class CountTokensAdapter(MessagesAdapter):
    """`/v1/messages/count_tokens`: the Messages body without `max_tokens`, answered locally
    with `count_tokens_body(total)`."""

    name: ClassVar[str] = "messages.count_tokens"
    requires_max_tokens: ClassVar[bool] = False


def _system(system: object, view: ViewBuilder) -> None:
    if system is None or system == "":
        return
    if isinstance(system, str):
        view.add({"role": "system", "content": system}, (Origin("system"),))
        return
    if not isinstance(system, list):
        raise InvalidRequest("system: must be a string or an array of text blocks", param="system")
    parts = []
    for j, block in enumerate(system):
        if not isinstance(block, Mapping) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise InvalidRequest(f"system.{j}: must be a text block", param=f"system.{j}")
        parts.append(text_part(block["text"]))
    view.add({"role": "system", "content": parts}, (Origin("system"),), tuple(range(len(parts))))


def _message(message: object, i: int, view: ViewBuilder) -> None:
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
    for j, block in enumerate(content):
        if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
            raise InvalidRequest(f"{where}.content.{j}: must be a block with a 'type'", param=f"{where}.content.{j}")
    if role == "assistant":
        _assistant(content, i, view)
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


def _assistant(content: list[Mapping[str, Any]], i: int, view: ViewBuilder) -> None:
    parts: list[dict[str, Any]] = []
    mapping: list[int | None] = []
    calls: list[dict[str, Any]] = []
    thinking: list[str] = []
    for j, block in enumerate(content):
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
    view.add(message, (Origin("messages", i),), tuple(mapping))


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
        return {"type": "image_url", "image_url": {"url": _source_url(source), "detail": "auto"}}
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


def _tools(tools: object, view: ViewBuilder) -> tuple[list[Any], int]:
    """The tools in the chat shape, and the published prompt tokens of Anthropic-defined ones."""
    if tools is None:
        return [], 0
    if not isinstance(tools, list):
        raise InvalidRequest("tools: must be an array", param="tools")
    converted: list[Any] = []
    fixed = 0
    for j, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise InvalidRequest(f"tools.{j}: must be an object", param=f"tools.{j}")
        kind = str(tool.get("type") or "")
        fixed += next((tokens for prefix, tokens in SERVER_TOOL_TOKENS if kind.startswith(prefix)), 0)
        if tool.get("type") in (None, "custom") and "input_schema" in tool:
            function = {"name": tool.get("name"), "parameters": tool.get("input_schema")}
            if isinstance(tool.get("description"), str):
                function["description"] = tool["description"]
            examples = tool.get("input_examples")
            if examples is not None:  # shown to the model beside the tool: counted as their JSON, with it
                shown = json.dumps(examples, ensure_ascii=False)
                function["description"] = f"{function.get('description', '')}\n\nExamples: {shown}".lstrip()
                view.estimate(f"tools.{j}: input_examples counted as their JSON")
            converted.append({"type": "function", "function": function})
        else:
            view.estimate(f"tools.{j}: server tool {tool.get('type')!r} estimated from its JSON")
            converted.append(dict(tool))
    return converted, fixed


def _write_back(
    body: dict[str, Any], messages: list[Any], source: Source, old: Mapping[str, Any], new: Mapping[str, Any]
) -> None:
    """Put the text trimming shortened back into the blocks it came from."""
    origin = source.origins[0]
    content = new.get("content")
    if origin.field == "system":
        if isinstance(content, str):
            body["system"] = content
        elif isinstance(body.get("system"), list):
            body["system"] = _write_blocks(body["system"], source, old, new)
        return
    if origin.index is None:
        return
    message = messages[origin.index]
    if origin.block is not None and old.get("role") == "tool":  # a tool_result block
        blocks = list(message["content"])
        result = blocks[origin.block]
        if isinstance(content, str):
            blocks[origin.block] = {**result, "content": content}
        elif isinstance(result.get("content"), list):
            blocks[origin.block] = {**result, "content": _write_blocks(result["content"], source, old, new)}
        messages[origin.index] = {**message, "content": blocks}
    elif isinstance(content, str):
        messages[origin.index] = {**message, "content": content}
    elif isinstance(message.get("content"), list):
        messages[origin.index] = {**message, "content": _write_blocks(message["content"], source, old, new)}


def _write_blocks(blocks: Sequence[Any], source: Source, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Any]:
    out = list(blocks)
    old_parts, new_parts = old.get("content"), new.get("content")
    if not isinstance(old_parts, list) or not isinstance(new_parts, list):
        return out
    for j in changed_parts(old_parts, new_parts) or ():
        text = part_text(new_parts[j])
        target = source.parts[j] if j < len(source.parts) else None
        if text is None or target is None:
            continue
        block = out[target]
        if block.get("type") == "text":
            out[target] = {**block, "text": text}
        elif block.get("type") == "document" and isinstance(block.get("source"), Mapping):
            out[target] = {**block, "source": {**block["source"], "data": text}}
        else:  # an image replaced by a marker
            out[target] = {"type": "text", "text": text}
    return out


def _join(first: Mapping[str, Any], second: Mapping[str, Any]) -> dict[str, Any]:
    return {**first, "content": content_blocks(first.get("content")) + content_blocks(second.get("content"))}


def content_blocks(content: object) -> list[Any]:
    if isinstance(content, str):
        return [text_part(content)] if content else []
    return list(content) if isinstance(content, list) else []
