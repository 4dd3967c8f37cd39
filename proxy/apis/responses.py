"""OpenAI Responses (`POST /v1/responses`) as the core's chat-completions view.

    instructions                      -> a system message (pinned)
    input: "text"                     -> a user message
    input: [items]
      message (input_text, input_image, input_file, output_text, refusal parts)
                                      -> a message of the same role, part for part
      function_call, custom_tool_call -> an assistant message with tool_calls; consecutive calls
                                         share one message, as parallel calls do in chat
      function_call_output, custom_tool_call_output
                                      -> a tool message answering its call_id: the call and its
                                         outputs are one atomic unit for the core
      reasoning                       -> kept with the item it precedes (its summary counted as
                                         `reasoning_content`; encrypted content cannot be counted)
      item_reference                  -> a pinned placeholder: the item lives on the provider
      any other item                  -> counted as its JSON; `*_call` / `*_call_output` items
                                         with a call_id pair up like function calls
    tools (flat function tools)       -> chat function tools; built-in tools counted as their JSON
    text.format (json_schema)         -> response_format
    max_output_tokens                 -> max_completion_tokens (the output reserve)

Where the provider adds what the guard cannot see (`previous_response_id`, `conversation`, a
stored `prompt`, hosted tools and their items, `item_reference`, encrypted reasoning, files fetched
by URL or id, `reasoning.mode`), what was sent is counted and the request is flagged
`server_state`: the count is neither exact nor a bound, and a note names each such part. The
API's own framing, where it differs from chat's, comes with the model's format (`profile`).
Pinned against recorded API counts in tests/data/responses_api_counts.json.
Rendering writes drops and shortened text back into the items, and a message the trim added
(the budget note, a summary) as a system message item where the dropped items were; every other
field and item is kept exactly as sent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
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
    opaque_part,
    optional_model,
    output_reserve,
    part_text,
    require_object,
    stream_flag,
    text_part,
)
from proxy.apis.fields import unread_fields
from proxy.apis.known import NOTHING_KNOWN, KnownPrefix
from proxy.core.models import ModelProfile

MESSAGE_ROLES = frozenset({"user", "assistant", "system", "developer"})
CALL_TYPES = frozenset({"function_call", "custom_tool_call"})
OUTPUT_TYPES = frozenset({"function_call_output", "custom_tool_call_output"})
TEXT_PART_TYPES = frozenset({"input_text", "output_text"})


# gpt-4o and gpt-4.1 answered 6 below chat's rendering of the same function tool (8 with a call and its
# output after it; four recordings):
# the Responses rendering of tools is not published, and chat's is its bound.
FUNCTION_TOOLS_BOUND = "Responses function tools: counted with chat's rendering, an upper bound (measured 6 to 8 above)"


class _Builder(ViewBuilder):
    """The view of the input items, built in one walk: reasoning waits for the item it precedes,
    and consecutive calls share one assistant message."""

    def __init__(self) -> None:
        super().__init__()
        self._reasoning: list[int] = []  # reasoning items waiting for the item they precede
        self._reasoning_text: list[str] = []
        self._call_group: int | None = None  # the view message the last call items went into
        self.unseen = False  # the provider adds content the guard cannot see: the count is no bound

    def provider_adds(self, note: str) -> None:
        """Part of what the model reads is added by the provider (hosted tools' instructions and
        results, stored items, hidden reasoning): the count is neither exact nor a bound."""
        self.unseen = True
        self.estimate(f"not counted, no bound: {note}")

    def add(self, message: dict[str, Any], origins: Sequence[Origin], parts: Sequence[int | None] = ()) -> None:
        if self._reasoning:
            origins = (*(Origin("input", k) for k in self._reasoning), *origins)
            if self._reasoning_text:
                message["reasoning_content"] = "\n".join(self._reasoning_text)
            self._reasoning, self._reasoning_text = [], []
        super().add(message, origins, parts)
        self._call_group = None

    def add_call(self, call: dict[str, Any], index: int) -> None:
        group = self._call_group
        if group is not None and not self._reasoning:
            self.messages[group]["tool_calls"].append(call)
            source = self.sources[group]
            self.sources[group] = Source((*source.origins, Origin("input", index)))
            return
        self.add({"role": "assistant", "content": None, "tool_calls": [call]}, (Origin("input", index),))
        self._call_group = len(self.messages) - 1

    def reasoning(self, item: Mapping[str, Any], index: int) -> None:
        self._reasoning.append(index)
        for key in ("summary", "content"):
            for part in item.get(key) or ():
                if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                    self._reasoning_text.append(part["text"])
        if item.get("encrypted_content"):
            self.provider_adds(f"input[{index}]: encrypted reasoning, which the provider decrypts and re-reads")

    def finish(self) -> None:
        if self._reasoning:  # reasoning at the very end: kept as a message of its own
            self.add({"role": "assistant", "content": None}, ())


class ResponsesAdapter(Adapter):
    name: ClassVar[str] = "responses"
    writes_inserted: ClassVar[bool] = True
    resent_array: ClassVar[str | None] = "input"

    def parse(self, body: object, known: KnownPrefix = NOTHING_KNOWN) -> Parsed:
        body = require_object(body)
        build = _Builder()
        instructions = body.get("instructions")
        if isinstance(instructions, str):
            if instructions:
                build.add({"role": "system", "content": instructions}, (Origin("instructions"),))
        elif instructions is not None:
            raise InvalidRequest("'instructions' must be a string", param="instructions")
        items = body.get("input")
        if isinstance(items, str):
            build.add({"role": "user", "content": items}, (Origin("input"),))
        elif isinstance(items, list):
            for k, item in enumerate(items):
                _item(build, item, k)
            build.finish()
        elif items is not None:
            raise InvalidRequest("'input' must be a string or an array of input items", param="input")
        for key in ("previous_response_id", "conversation", "prompt"):
            if body.get(key) is not None:
                build.provider_adds(f"{key}: the context the provider holds")
        reasoning = body.get("reasoning")
        if isinstance(reasoning, Mapping) and reasoning.get("mode") is not None:
            build.provider_adds(f"reasoning.mode {reasoning['mode']!r}: the instructions the provider adds for it")
        if body.get("context_management"):
            # Two recordings with compaction configured but not yet triggered came out 3 and 4 below
            # the count of what was sent: the provider's own handling is not published.
            build.estimate("context_management: the provider may compact the input; counted as sent, an upper bound")
        if body.get("truncation") == "auto":
            build.notes.append("truncation: auto; the provider may also drop items itself")
        chat: dict[str, Any] = {"messages": build.messages}
        model = optional_model(body, required=False)
        if model is not None:
            chat["model"] = model
        tools = _tools(body.get("tools"), build)
        if tools:
            chat["tools"] = tools
        if body.get("tool_choice") is not None:
            chat["tool_choice"] = body["tool_choice"]
        response_format = _response_format(body.get("text"))
        if response_format is not None:
            chat["response_format"] = response_format
        reserve = output_reserve(body, "max_output_tokens")
        if reserve is not None:
            chat["max_completion_tokens"] = reserve
        return Parsed(
            api=self.name,
            body=body,
            chat=chat,
            sources=tuple(build.sources),
            model=model,
            stream=stream_flag(body),
            server_state=build.unseen,
            exact=build.exact,
            notes=tuple(build.notes),
            reserve_field="max_output_tokens",
            reserve_view_field="max_completion_tokens",
            unread=unread_fields(body, fields.RESPONSES),
        )

    def profile(self, profile: ModelProfile, parsed: Parsed) -> ModelProfile:
        """The model's chat framing with what the Responses API writes differently (its assistant
        history, its own per-request tokens), folded into the fixed tokens: a cut assistant
        message leaves its share counted, which errs high."""
        fmt = profile.chat_format
        assistants = sum(1 for message in parsed.messages if message.get("role") == "assistant")
        extra = fmt.responses_extra + fmt.responses_assistant * assistants
        if extra:
            fmt = replace(
                fmt, reply_priming=fmt.reply_priming + extra, messages_bound=fmt.messages_bound or fmt.responses_bound
            )
            profile = replace(profile, chat_format=fmt)
        return super().profile(profile, parsed)

    def _render(self, parsed: Parsed, changes: Changes) -> dict[str, Any]:
        body = dict(parsed.body)
        raw_items = body.get("input")
        items: list[Any] = list(raw_items) if isinstance(raw_items, list) else []
        for i, new in changes.replaced.items():
            source = parsed.sources[i]
            primary = source.origins[-1]
            content = new.get("content")
            if primary.field == "instructions" and isinstance(content, str):
                body["instructions"] = content
            elif primary.field == "input" and primary.index is None and isinstance(content, str):
                body["input"] = content
            elif primary.field == "input" and primary.index is not None:
                items[primary.index] = _write_item(items[primary.index], parsed.messages[i], new)
        if isinstance(raw_items, list):
            dropped = {
                origin.index
                for i in changes.dropped
                for origin in parsed.sources[i].origins
                if origin.field == "input" and origin.index is not None
            }
            # The trim's added messages (the budget note, a summary) as system message items.
            before = inserted_texts(parsed, changes, "input", len(items))
            out: list[Any] = []
            for k, item in enumerate([*items, None]):
                out += [{"type": "message", "role": "system", "content": text} for text in before.get(k, ())]
                if item is not None and k not in dropped:
                    out.append(item)
            body["input"] = out
        return body


def _item(build: _Builder, item: object, k: int) -> None:
    where = f"input[{k}]"
    if not isinstance(item, Mapping):
        raise InvalidRequest(f"{where} must be an object", param=where)
    kind = item.get("type")
    if kind is None and "role" in item:
        kind = "message"
    if not isinstance(kind, str):
        raise InvalidRequest(f"{where} has no 'type'", param=f"{where}.type")
    if kind == "message":
        role = item.get("role")
        if role not in MESSAGE_ROLES:
            raise InvalidRequest(
                f"{where}.role must be one of {', '.join(sorted(MESSAGE_ROLES))}", param=f"{where}.role"
            )
        content, parts = _content(item.get("content"), f"{where}.content")
        _fetched_parts(build, item.get("content"), f"{where}.content")
        build.add({"role": role, "content": content}, (Origin("input", k),), parts)
    elif kind in CALL_TYPES:
        call_id = _string(item, "call_id", where)
        name = _string(item, "name", where)
        arguments = item.get("arguments") if kind == "function_call" else item.get("input")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False, default=str)
        build.add_call({"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}, k)
    elif kind in OUTPUT_TYPES:
        call_id = _string(item, "call_id", where)
        content, parts = _content(item.get("output"), f"{where}.output")
        _fetched_parts(build, item.get("output"), f"{where}.output")
        build.add({"role": "tool", "tool_call_id": call_id, "content": content}, (Origin("input", k),), parts)
    elif kind == "reasoning":
        build.reasoning(item, k)
    elif kind == "item_reference":
        build.provider_adds(f"{where}: item_reference, an item the provider stores")
        build.add({"role": "system", "content": [opaque_part(dict(item))]}, (Origin("input", k),))
    else:
        _other_item(build, item, kind, k)


def _other_item(build: _Builder, item: Mapping[str, Any], kind: str, k: int) -> None:
    """Items this adapter does not model (hosted tool calls, computer use, MCP, ...): counted as
    their JSON, and paired by call_id when they are a call and its output."""
    build.provider_adds(f"input[{k}]: {kind} item, which the provider renders itself (counted as its JSON)")
    call_id = item.get("call_id")
    if isinstance(call_id, str) and kind.endswith("_call_output"):
        build.add(
            {"role": "tool", "tool_call_id": call_id, "content": [opaque_part(dict(item))]}, (Origin("input", k),)
        )
    elif isinstance(call_id, str) and kind.endswith("_call"):
        arguments = json.dumps(item, ensure_ascii=False, default=str, separators=(",", ":"))
        build.add_call({"id": call_id, "type": "function", "function": {"name": kind, "arguments": arguments}}, k)
    else:
        build.add({"role": "assistant", "content": [opaque_part(dict(item))]}, (Origin("input", k),))


def _string(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{where}.{key} is required and must be a string", param=f"{where}.{key}")
    return value


def _content(content: object, where: str) -> tuple[Any, tuple[int | None, ...]]:
    """A message's content (or a call output) as the view's content, and its part mapping."""
    if isinstance(content, str):
        return content, ()
    if isinstance(content, list):
        return [_part(part, f"{where}[{j}]") for j, part in enumerate(content)], tuple(range(len(content)))
    if content is None:
        raise InvalidRequest(f"{where} is required", param=where)
    return [opaque_part(content)], (None,)


def _fetched_parts(build: _Builder, content: object, where: str) -> None:
    """Files and images sent by id or URL that the provider fetches and extracts itself."""
    for j, part in enumerate(content if isinstance(content, list) else ()):
        if not isinstance(part, Mapping):
            continue
        if part.get("type") == "input_file" and not isinstance(part.get("file_data"), str):
            build.provider_adds(f"{where}[{j}]: a file the provider fetches by id or URL")
        elif part.get("type") == "input_image" and not isinstance(part.get("image_url"), str):
            build.provider_adds(f"{where}[{j}]: an image the provider fetches by file_id")


def _part(part: object, where: str) -> dict[str, Any]:
    if not isinstance(part, Mapping):
        raise InvalidRequest(f"{where} must be an object", param=where)
    kind = part.get("type")
    if kind in TEXT_PART_TYPES:
        text = part.get("text")
        if not isinstance(text, str):
            raise InvalidRequest(f"{where}.text must be a string", param=f"{where}.text")
        return text_part(text)
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return {"type": "refusal", "refusal": part["refusal"]}
    if kind == "input_image":
        url = part.get("image_url")
        detail = part.get("detail", "auto")
        return {"type": "image_url", "image_url": {"url": url if isinstance(url, str) else "", "detail": detail}}
    if kind == "input_file":
        file: dict[str, Any] = {}
        for key in ("file_data", "file_id", "filename"):
            if isinstance(part.get(key), str):
                file[key] = part[key]
        if isinstance(part.get("file_url"), str) and "file_id" not in file:
            file["file_id"] = part["file_url"]
        return {"type": "file", "file": file}
    if kind == "input_audio" and isinstance(part.get("input_audio"), Mapping):
        return {"type": "input_audio", "input_audio": part["input_audio"]}
    return opaque_part(dict(part))


def _write_item(item: Mapping[str, Any], old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """`item` with the text that trimming shortened in its view message (`old` -> `new`)."""
    key = "output" if str(item.get("type")) in OUTPUT_TYPES else "content"
    original = item.get(key)
    content = new.get("content")
    if isinstance(content, str):
        return {**item, key: content}
    old_content = old.get("content")
    if not isinstance(content, list) or not isinstance(old_content, list) or not isinstance(original, list):
        return dict(item)
    changed = changed_parts(old_content, content)
    if changed is None:
        return dict(item)
    parts = list(original)
    assistant = item.get("role") == "assistant"
    for j in changed:
        text = part_text(content[j])
        if text is None:
            continue
        before = parts[j]
        if isinstance(before, Mapping) and str(before.get("type")) in TEXT_PART_TYPES:
            parts[j] = {**before, "text": text}
        else:  # an image or file replaced by a marker
            parts[j] = {"type": "output_text" if assistant else "input_text", "text": text}
    return {**item, key: parts}


def _tools(tools: object, build: _Builder) -> list[Any]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise InvalidRequest("'tools' must be an array", param="tools")
    converted: list[Any] = []
    for j, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise InvalidRequest(f"tools[{j}] must be an object", param=f"tools[{j}]")
        if tool.get("type") == "function":
            function = {key: tool[key] for key in ("name", "description", "parameters") if key in tool}
            # Responses function tools are strict unless they say otherwise, and strict ones have
            # no measured rendering: the count says so (proxy.core.tool_schema).
            function["strict"] = tool.get("strict", True)
            converted.append({"type": "function", "function": function})
            if FUNCTION_TOOLS_BOUND not in build.notes:
                build.estimate(FUNCTION_TOOLS_BOUND)
        else:
            build.provider_adds(f"tools[{j}]: built-in tool {tool.get('type')!r}, its instructions and results")
            converted.append(dict(tool))
    return converted


def _response_format(text: object) -> dict[str, Any] | None:
    fmt = text.get("format") if isinstance(text, Mapping) else None
    if not isinstance(fmt, Mapping):
        return None
    if fmt.get("type") == "json_schema":
        schema = {key: fmt[key] for key in ("name", "description", "schema", "strict") if key in fmt}
        return {"type": "json_schema", "json_schema": schema}
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    return None
