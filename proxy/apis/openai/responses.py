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

This module is the adapter: the request's fields, the Responses framing and the cut written back
into the items. Reading the input items, the tools and `text.format` into the view is
`proxy.apis.openai.responses_items`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar

from proxy.apis import fields
from proxy.apis.base import (
    Adapter,
    Changes,
    HeldContext,
    InvalidRequest,
    Origin,
    Parsed,
    optional_model,
    output_reserve,
    require_object,
    shortened_texts,
)
from proxy.apis.cut_positions import inserted_texts
from proxy.apis.endpoints import Endpoint, Shape, ShapeOptions
from proxy.apis.fields import NOTHING_KNOWN, KnownPrefix
from proxy.apis.openai.responses_items import (
    OUTPUT_TYPES,
    TEXT_PART_TYPES,
    ItemsBuilder,
    chat_response_format,
    chat_tools,
    read_items,
)
from proxy.apis.stream_errors import responses_broken
from proxy.core.models.model_registry import ModelProfile
from proxy.core.work_budget import ITEM_UNITS, spend


class ResponsesAdapter(Adapter):
    name: ClassVar[str] = "responses"
    writes_inserted: ClassVar[bool] = True
    resent_array: ClassVar[str | None] = "input"
    accounted: ClassVar[frozenset[str]] = fields.RESPONSES
    reserve_field: ClassVar[str | None] = "max_output_tokens"
    reserve_view_field: ClassVar[str | None] = "max_completion_tokens"
    compacts: ClassVar[bool] = False  # every request asks to compact (`ResponsesCompactAdapter`)

    def broken_stream_event(self, message: str) -> bytes:
        return responses_broken(message)

    def parse(self, body: object, known: KnownPrefix = NOTHING_KNOWN) -> Parsed:
        body = require_object(body)
        build = ItemsBuilder()
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
            spend(ITEM_UNITS * len(items))  # each item is read: moved to a thread when they are many
            read_items(build, items)
        elif items is not None:
            raise InvalidRequest("'input' must be a string or an array of input items", param="input")
        for key in ("previous_response_id", "conversation", "prompt"):
            if body.get(key) is not None:
                build.provider_adds(f"{key}: the context the provider holds", _held(key, body[key]))
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
        tools = chat_tools(body.get("tools"), build)
        if tools:
            chat["tools"] = tools
        if body.get("tool_choice") is not None:
            chat["tool_choice"] = body["tool_choice"]
        response_format = chat_response_format(body.get("text"))
        if response_format is not None:
            chat["response_format"] = response_format
        reserve = output_reserve(body, "max_output_tokens")
        if reserve is not None:
            chat["max_completion_tokens"] = reserve
        if self.compacts:  # `/responses/compact`: the whole request is the one to compact
            build.trigger((), "responses/compact")
        return build.parsed(self, body, chat, model, fixed_tokens=build.marker_tokens)

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
            if not source.origins:  # a message of the view's own (the end of a compact request)
                continue
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


class ResponsesCompactAdapter(ResponsesAdapter):
    """`POST /v1/responses/compact`: a Responses body the provider compacts into a compaction item.
    The whole request is a compaction request: counted, and fitted as one (its tool results
    shortened evenly, its opening kept), as if its input ended in a `compaction_trigger`."""

    compacts: ClassVar[bool] = True


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
    parts = list(original)
    assistant = item.get("role") == "assistant"
    for j, text in shortened_texts(old_content, content):
        before = parts[j]
        if isinstance(before, Mapping) and str(before.get("type")) in TEXT_PART_TYPES:
            parts[j] = {**before, "text": text}
        else:  # an image or file replaced by a marker
            parts[j] = {"type": "output_text" if assistant else "input_text", "text": text}
    return {**item, key: parts}


def _held(key: str, value: object) -> HeldContext | None:
    """The stored response or conversation a request names (a conversation may be given as its id
    or as `{"id": ...}`); a prompt template is not held context of the conversation."""
    if key == "conversation" and isinstance(value, Mapping):
        value = value.get("id")
    if not isinstance(value, str) or key == "prompt":
        return None
    return HeldContext("response" if key == "previous_response_id" else "conversation", value)


RESPONSES_PATHS = ("/v1/responses", "/responses", "/openai/v1/responses", "/openai/responses")
COMPACT_PATHS = ("/v1/responses/compact", "/responses/compact", "/openai/v1/responses/compact")


def shape(options: ShapeOptions) -> Shape:
    """OpenAI Responses, and its compaction requests (read with the same reader)."""
    adapter = ResponsesAdapter()
    compact = Endpoint(ResponsesCompactAdapter())
    exact = {**dict.fromkeys(RESPONSES_PATHS, Endpoint(adapter)), **dict.fromkeys(COMPACT_PATHS, compact)}
    return Shape(adapter.name, (adapter,), exact)
