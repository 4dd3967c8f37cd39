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
    thinking                           -> thinking (not counted: its budget_tokens is what a
                                          clamp of max_tokens must stay above)
    context_management                 -> the context edits it asks for: the request is counted
                                          as the provider will see it once they ran, or they are
                                          applied by the guard for an upstream that cannot
                                          (`edited`; `proxy.apis.anthropic.context_edits`)

A tool_use and the tool_result answering it are one atomic unit for the core even though they
sit in different messages. Rendering drops and shortens blocks in place, then joins any two
messages of one role that a drop left side by side, so roles still alternate and the
conversation still opens with a user message. A message the trim added (the budget note, a
summary) becomes a text block opening the user message after the dropped ones. Errors take Anthropic's shape,
`{"type": "error", "error": {"type", "message"}}`.

This module is the adapter: the request's fields, the image pricing, the error shape and the cut
written back into the blocks. Reading the system prompt and the messages block by block is
`proxy.apis.anthropic.anthropic_blocks`'s; the tools and the prompt tokens Anthropic adds for them are
`proxy.apis.anthropic.anthropic_tools`'s.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar

from proxy.apis import fields
from proxy.apis.anthropic.anthropic_blocks import drop_before_compaction, read_messages, read_system
from proxy.apis.anthropic.anthropic_tools import chat_tools, tool_prompt_tokens
from proxy.apis.anthropic.applied_edits import StreamedAnswer, WholeAnswer
from proxy.apis.anthropic.context_edits import Edit, TokenSizes, apply_edits, requested_edits, without_edits
from proxy.apis.base import (
    Adapter,
    AnswerAmendment,
    Changes,
    EditedRequest,
    InvalidRequest,
    Parsed,
    Source,
    ViewBuilder,
    optional_model,
    output_reserve,
    require_object,
    shortened_texts,
    text_part,
)
from proxy.apis.cut_positions import alternating, dropped_origins, inserted_texts
from proxy.apis.endpoints import Endpoint, Shape, ShapeOptions
from proxy.apis.fields import NOTHING_KNOWN, KnownPrefix
from proxy.apis.stream_errors import anthropic_broken
from proxy.core.costs.images import AreaCost
from proxy.core.counting.edge import bound_ratio_of, lower_bound
from proxy.core.counting.request_count import RequestCounter
from proxy.core.models.model_registry import ModelProfile
from proxy.core.trimming.budget import TrimResult
from proxy.errors import GuardError

EDITS = "context_edits"  # `Parsed.private`: the context edits a request asks for
ANTHROPIC_IMAGES = AreaCost(pixels_per_token=750, max_long_side=1568, max_tokens=1600)

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


def count_tokens_body(input_tokens: int) -> dict[str, int]:
    """The answer of `/v1/messages/count_tokens`."""
    return {"input_tokens": input_tokens}


def anthropic_error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """An error as Anthropic words it: its type by status, the field named in the message."""
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": f"{param}: {message}" if param else message}}


class MessagesAdapter(Adapter):
    name: ClassVar[str] = "messages"
    writes_inserted: ClassVar[bool] = True
    requires_max_tokens: ClassVar[bool] = True
    resent_array: ClassVar[str | None] = "messages"
    accounted: ClassVar[frozenset[str]] = fields.MESSAGES
    reserve_field: ClassVar[str | None] = "max_tokens"
    reserve_view_field: ClassVar[str | None] = "max_tokens"

    def parse(self, body: object, known: KnownPrefix = NOTHING_KNOWN) -> Parsed:
        body = require_object(body)
        model = optional_model(body, required=False)
        view = ViewBuilder()
        read_system(body.get("system"), view)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise InvalidRequest("messages: a non-empty array is required", param="messages")
        read_messages(messages, view)
        chat: dict[str, Any] = {"messages": view.messages}
        if model is not None:
            chat["model"] = model
        listed = body.get("tools")
        tools, fixed = ([], 0) if listed is None else chat_tools(listed, view)
        if tools:
            chat["tools"] = tools
            fixed += tool_prompt_tokens(model, body.get("tool_choice"))
        if isinstance(body.get("tool_choice"), Mapping):
            chat["tool_choice"] = body["tool_choice"]
        reserve = output_reserve(body, "max_tokens", required=self.requires_max_tokens)
        if reserve is not None:
            chat["max_tokens"] = reserve
        if isinstance(body.get("thinking"), Mapping):  # its budget_tokens bounds a clamp of max_tokens
            chat["thinking"] = body["thinking"]
        schema = body.get("output_format")
        if isinstance(schema, Mapping) and schema.get("type") == "json_schema":
            chat["response_format"] = {"type": "json_schema", "json_schema": {"schema": schema.get("schema")}}
        parsed = view.parsed(self, body, chat, model, fixed_tokens=fixed)
        edits = requested_edits(body) if "context_management" in body else None
        return parsed if edits is None else replace(parsed, private={**parsed.private, EDITS: edits})

    def edited(self, parsed: Parsed, counter: RequestCounter, by_guard: bool) -> EditedRequest | None:
        """The request once Anthropic's context edits it asks for have run (`context_edits`): by
        the provider, whose token trigger is taken to fire only when the least it can count
        exceeds it, or (`by_guard`) by the guard, for an upstream that cannot, on the guard's own
        count; then the field goes, and what was cleared is added to the answer."""
        edits: tuple[Edit, ...] | None = parsed.private.get(EDITS)
        if edits is None:
            return None
        counted: list[int] = []
        count, exact, ratio = counter.text, counter.tokenizer.exact, bound_ratio_of(counter.tokenizer)

        def least(tokens: int) -> int:  # what the provider counts at least, for a count the guard acts on
            return tokens if by_guard else lower_bound(tokens, exact, ratio) or 0

        def input_tokens() -> int:
            if not counted:
                counted.append(counter.request(parsed.chat).total)
            return least(counted[0])

        sizes = TokenSizes(count, lambda text: least(count(text)))
        result = apply_edits(parsed.body, edits, input_tokens, sizes)
        original = counted[0] if counted and result.applied else None
        target = parsed if not result.applied else self.parse(result.body).with_model(parsed.model)
        if not by_guard:
            return EditedRequest(target, original)
        sent = without_edits(target.body)
        answer = {"context_management": {"applied_edits": list(result.applied)}} if result.applied else None
        return EditedRequest(replace(target, body=sent), original, sent, answer)

    def answer_amendment(self, fields: Mapping[str, Any], stream: bool) -> AnswerAmendment | None:
        return StreamedAnswer(fields) if stream else WholeAnswer(fields)

    # The last profile priced by Anthropic's rule and its priced copy: requests of a model count
    # with its route's one profile, and a new copy would hash every field again (`ModelProfile.rules_hash`).
    _priced: tuple[ModelProfile, ModelProfile] | None = None

    def profile(self, profile: ModelProfile, parsed: Parsed) -> ModelProfile:
        """Images are priced by Anthropic's rule on this API, whatever the model's family."""
        priced = self._priced
        if priced is None or priced[0] is not profile:
            priced = self._priced = (profile, replace(profile, images=ANTHROPIC_IMAGES))
        return super().profile(priced[1], parsed)

    def error_body(self, error: GuardError) -> dict[str, Any]:
        return anthropic_error_body(error.status, error.message, error.param)

    def overflow_refusal(self, result: TrimResult) -> tuple[str, str | None]:
        return result.rejection_message(result.anthropic_overflow()), None  # Anthropic's errors name no field

    def broken_stream_event(self, message: str) -> bytes:
        return anthropic_broken(message)

    def _render(self, parsed: Parsed, changes: Changes) -> dict[str, Any]:
        body = dict(parsed.body)
        messages: list[Any] = list(body["messages"])
        for i, new in changes.replaced.items():
            _write_back(body, messages, parsed.sources[i], parsed.messages[i], new)
        whole, blocks = dropped_origins(parsed, changes, "messages")
        drop_before_compaction(parsed, whole, blocks)
        # Anthropic has no system messages among the turns: each message the trim added (the budget
        # note, a summary) is a text block opening the user message after the dropped ones.
        notes = inserted_texts(parsed, changes, "messages", len(messages))
        body["messages"] = alternating(messages, whole, blocks, notes, text_part)
        return body


class CountTokensAdapter(MessagesAdapter):
    """`/v1/messages/count_tokens`: the Messages body without `max_tokens`, answered locally
    with `count_tokens_body(total)`; with the count before its context edits, when it asks for
    any, as Anthropic answers it."""

    name: ClassVar[str] = "messages.count_tokens"
    requires_max_tokens: ClassVar[bool] = False

    def count_answer(self, answer: Mapping[str, Any], original_tokens: int | None) -> Mapping[str, Any]:
        if original_tokens is None:
            return answer
        return {**answer, "context_management": {"original_input_tokens": original_tokens}}


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
    for j, text in shortened_texts(old_parts, new_parts):
        target = source.parts[j] if j < len(source.parts) else None
        if target is None:
            continue
        block = out[target]
        if block.get("type") == "text":
            out[target] = {**block, "text": text}
        elif block.get("type") == "document" and isinstance(block.get("source"), Mapping):
            out[target] = {**block, "source": {**block["source"], "data": text}}
        else:  # an image replaced by a marker
            out[target] = {"type": "text", "text": text}
    return out


# Vertex AI's Claude: the model in the path (`count-tokens` names its count endpoint).
_VERTEX_CLAUDE = re.compile(
    r"/v1/projects/[^/]+/locations/[^/]+/publishers/anthropic/models/(?P<model>[^/:]+):(?P<method>rawPredict|streamRawPredict)"
)


def shape(options: ShapeOptions) -> Shape:
    """Anthropic Messages at Anthropic's paths and Vertex AI's Claude paths; its count endpoint
    answered locally (logged as `count_tokens`)."""
    adapter, count = MessagesAdapter(), CountTokensAdapter()
    counting = Endpoint(count, local=True, answer=count_tokens_body, named="count_tokens")
    exact = {**dict.fromkeys(("/v1/messages", "/messages"), Endpoint(adapter)),
             **dict.fromkeys(("/v1/messages/count_tokens", "/messages/count_tokens"), counting)}  # fmt: skip

    def vertex(path: str) -> Endpoint | None:
        found = _VERTEX_CLAUDE.fullmatch(path)
        if found is None:
            return None
        if found["model"] == "count-tokens":
            return counting
        return Endpoint(adapter, path_model=found["model"], stream=found["method"] == "streamRawPredict")

    return Shape(adapter.name, (adapter, count), exact, vertex)
