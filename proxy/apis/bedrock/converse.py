"""Bedrock Converse (`POST /model/{modelId}/converse`, `/converse-stream`) as the core's chat view.

Converse's content blocks are Anthropic's in other clothes: a block is an object with one key
(`text`, `image`, `document`, `toolUse`, `toolResult`, `reasoningContent`, `cachePoint`, ...).
Each block is read as the Anthropic block it mirrors, at the same message and block position, so
the Anthropic readers build the view and every view message's origin is a place in the Converse
body itself; the cut is written back into the Converse blocks:

    system[] (text, guardContent, cachePoint)   -> a pinned system message
    user message                                -> its toolResult blocks first, one tool message
                                                   each (answering the toolUseId), then a user
                                                   message with the other blocks
    assistant message                           -> text parts, toolUse as tool_calls,
                                                   reasoningContent as reasoning (counted, kept)
    image / document (bytes)                    -> priced as Anthropic prices them on Claude
                                                   (the area rule; a PDF's pages)
    cachePoint                                  -> nothing: a marker, not prompt text
    toolConfig.tools[].toolSpec                 -> chat function tools (inputSchema.json)
    inferenceConfig.maxTokens                   -> the output reserve

The model is the path's (`/model/{modelId}/...`): a foundation model id, an inference profile
(`us.anthropic.claude-...`) or an ARN naming either; `foundation_model` finds the model inside,
which is what windows and tokenizers are looked up by. Errors take Bedrock's shape,
`{"message": ...}` (the exception's name goes in the `x-amzn-ErrorType` header).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, ClassVar
from urllib.parse import unquote

from proxy.apis.anthropic.anthropic_blocks import read_message, read_system
from proxy.apis.anthropic.anthropic_tools import chat_tools, tool_prompt_tokens
from proxy.apis.anthropic.messages import ANTHROPIC_IMAGES
from proxy.apis.base import (
    Adapter,
    Changes,
    InvalidRequest,
    Parsed,
    Source,
    ViewBuilder,
    require_object,
    shortened_texts,
)
from proxy.apis.bedrock.event_streams import CONTENT_TYPE, EventStreamFraming, broken_frame, converse_usage
from proxy.apis.cut_positions import alternating, dropped_origins, inserted_texts
from proxy.apis.fields import NOTHING_KNOWN, KnownPrefix
from proxy.apis.stream_errors import StreamFraming
from proxy.core.models.model_registry import ModelProfile
from proxy.core.trimming.budget import TrimResult
from proxy.errors import GuardError

CONVERSE_FIELDS = frozenset(
    {
        "messages", "system", "inferenceConfig", "toolConfig", "additionalModelRequestFields",
        "additionalModelResponseFieldPaths", "guardrailConfig", "promptVariables", "requestMetadata",
        "performanceConfig", "modelId",
    }
)  # fmt: skip
# Bedrock's exception names by HTTP status, as its SDKs read them from `x-amzn-ErrorType`.
EXCEPTIONS = {
    400: "ValidationException",
    401: "AccessDeniedException",
    403: "AccessDeniedException",
    404: "ResourceNotFoundException",
    408: "ModelTimeoutException",
    413: "ValidationException",
    424: "ModelErrorException",
    429: "ThrottlingException",
    503: "ServiceUnavailableException",
}
# Regional and global inference profiles prefix the foundation model's id with where they route.
_PROFILE_PREFIXES = ("us.", "us-gov.", "eu.", "apac.", "jp.", "au.", "ca.", "global.")
_TEXT_DOCUMENTS = frozenset({"txt", "md", "csv", "html"})
_MEDIA = {"png": "image/png", "jpeg": "image/jpeg", "jpg": "image/jpeg", "gif": "image/gif", "webp": "image/webp"}


def foundation_model(model_id: str) -> str:
    """The foundation model a Converse model id names: its URL-decoding, the resource of an ARN
    (`...:foundation-model/ID`, `...:inference-profile/us.ID`), less an inference profile's region
    prefix. An application profile's or provisioned model's ARN names no model: returned as is."""
    name = unquote(model_id)
    if name.startswith("arn:"):
        resource = name.rsplit(":", 1)[-1] if "/" not in name else name.split("/", 1)[1]
        kind = name.split(":", 5)[-1].split("/", 1)[0]
        if kind not in ("foundation-model", "inference-profile"):
            return name
        name = resource
    for prefix in _PROFILE_PREFIXES:
        if name.startswith(prefix) and "." in name[len(prefix) :]:
            return name[len(prefix) :]
    return name


ERROR_NAMESPACE = "http://internal.amazon.com/coral/com.amazon.bedrock/"


def bedrock_error_body(message: str) -> dict[str, str]:
    return {"message": message}


def error_headers(error: GuardError) -> dict[str, str]:
    """Where Bedrock's SDKs read an error's name: `x-amzn-ErrorType` (botocore takes what precedes the `:`)."""
    return {"x-amzn-ErrorType": f"{exception_name(error.status)}:{ERROR_NAMESPACE}"}


def exception_name(status: int) -> str:
    return EXCEPTIONS.get(status, "InternalServerException" if status >= 500 else "ValidationException")


class BedrockWays:
    """What every bedrock-runtime operation's adapter answers alike: errors as `{"message"}` with
    the exception's name in `x-amzn-ErrorType`, the guard's overflow in the words Bedrock relays
    Claude's in, streams as AWS event streams (ended by an exception frame when broken), and
    Converse's own spelling of the usage."""

    def error_body(self, error: GuardError) -> dict[str, Any]:
        return bedrock_error_body(error.named_message)

    def error_headers(self, error: GuardError) -> dict[str, str]:
        return error_headers(error)

    def overflow_refusal(self, result: TrimResult) -> tuple[str, str | None]:
        return result.rejection_message(result.anthropic_overflow()), None

    def broken_stream_event(self, message: str) -> bytes:
        return broken_frame(message)

    def stream_framing(self, content_type: str) -> StreamFraming | None:
        return EventStreamFraming() if content_type.startswith(CONTENT_TYPE) else None

    def answer_usage(self, payload: Mapping[str, Any]) -> tuple[int, int | None, int | None] | None:
        return converse_usage(payload)


class ConverseAdapter(BedrockWays, Adapter):
    name: ClassVar[str] = "converse"
    writes_inserted: ClassVar[bool] = True
    resent_array: ClassVar[str | None] = "messages"
    accounted: ClassVar[frozenset[str]] = CONVERSE_FIELDS
    reserve_view_field: ClassVar[str | None] = "max_tokens"

    def parse(self, body: object, known: KnownPrefix = NOTHING_KNOWN) -> Parsed:
        body = require_object(body)
        view = ViewBuilder()
        read_system(_system(body.get("system")), view)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise InvalidRequest("messages: a non-empty array is required", param="messages")
        for i, message in enumerate(messages):
            read_message(_message(message, i, view), i, view)
        chat: dict[str, Any] = {"messages": view.messages}
        config = body.get("toolConfig")
        tools, fixed = chat_tools(_tools(config), view)
        choice = config.get("toolChoice") if isinstance(config, Mapping) else None
        if tools:
            chat["tools"] = tools
        if isinstance(choice, Mapping):
            chat["tool_choice"] = choice
        reserve = _max_tokens(body.get("inferenceConfig"))
        if reserve is not None:
            chat["max_tokens"] = reserve
        extra = body.get("additionalModelRequestFields")
        if isinstance(extra, Mapping) and isinstance(extra.get("thinking"), Mapping):
            chat["thinking"] = extra["thinking"]
        parsed = view.parsed(self, body, chat, None, fixed_tokens=fixed)
        return replace(parsed, reserve_view_field="max_tokens" if reserve is not None else None)

    def profile(self, profile: ModelProfile, parsed: Parsed) -> ModelProfile:
        """Claude's images by Anthropic's rule; a Claude model's tool-use system prompt as
        Anthropic publishes it (other models' tool prompts are in the family's bounds)."""
        model = foundation_model(parsed.model or "")
        if "claude" in model and parsed.chat.get("tools"):
            extra = tool_prompt_tokens(model.split(".", 1)[-1], parsed.chat.get("tool_choice"))
            parsed = replace(parsed, fixed_tokens=parsed.fixed_tokens + extra)
        if "claude" in model:
            profile = replace(profile, images=ANTHROPIC_IMAGES)
        return super().profile(profile, parsed)

    def write_reserve(self, body: dict[str, Any], parsed: Parsed, reserve: int) -> None:
        body["inferenceConfig"] = {**body.get("inferenceConfig", {}), "maxTokens": reserve}

    def _render(self, parsed: Parsed, changes: Changes) -> dict[str, Any]:
        body = dict(parsed.body)
        messages: list[Any] = list(body["messages"])
        for i, new in changes.replaced.items():
            _write_back(body, messages, parsed.sources[i], parsed.messages[i], new)
        whole, blocks = dropped_origins(parsed, changes, "messages")
        notes = inserted_texts(parsed, changes, "messages", len(messages))
        body["messages"] = alternating(messages, whole, blocks, notes, lambda text: {"text": text})
        return body


def _system(system: object) -> list[dict[str, Any]] | None:
    """Converse's system blocks as Anthropic text blocks, position for position."""
    if system is None:
        return None
    if not isinstance(system, list):
        raise InvalidRequest("system: must be an array of system content blocks", param="system")
    blocks = []
    for j, block in enumerate(system):
        if not isinstance(block, Mapping):
            raise InvalidRequest(f"system.{j}: must be an object", param=f"system.{j}")
        text = block.get("text")
        guarded = block.get("guardContent")
        if isinstance(guarded, Mapping) and isinstance(guarded.get("text"), Mapping):
            text = guarded["text"].get("text")
        blocks.append({"type": "text", "text": text if isinstance(text, str) else ""})
    return blocks or None


def _message(message: object, i: int, view: ViewBuilder) -> Mapping[str, Any]:
    where = f"messages.{i}"
    if not isinstance(message, Mapping):
        raise InvalidRequest(f"{where}: must be an object", param=where)
    content = message.get("content")
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}.content: must be an array of content blocks", param=f"{where}.content")
    blocks = [_block(block, f"{where}.content.{j}", view) for j, block in enumerate(content)]
    return {"role": message.get("role"), "content": blocks}


def _block(block: object, where: str, view: ViewBuilder) -> dict[str, Any]:
    """One Converse content block as the Anthropic block it mirrors."""
    if not isinstance(block, Mapping) or len(block) != 1:
        raise InvalidRequest(f"{where}: must be an object with exactly one content field", param=where)
    ((kind, value),) = block.items()
    if kind == "text":
        if not isinstance(value, str):
            raise InvalidRequest(f"{where}.text: must be a string", param=f"{where}.text")
        return {"type": "text", "text": value}
    if kind == "cachePoint":
        return {"type": "text", "text": ""}
    value = value if isinstance(value, Mapping) else {}
    if kind == "toolUse":
        return {
            "type": "tool_use",
            "id": value.get("toolUseId"),
            "name": value.get("name"),
            "input": value.get("input"),
        }
    if kind == "toolResult":
        inner = value.get("content")
        inner = inner if isinstance(inner, list) else []
        results = [_result_block(b, f"{where}.toolResult.content.{j}", view) for j, b in enumerate(inner)]
        return {"type": "tool_result", "tool_use_id": value.get("toolUseId"), "content": results}
    if kind == "reasoningContent":
        text = value.get("reasoningText")
        if isinstance(text, Mapping) and isinstance(text.get("text"), str):
            return {"type": "thinking", "thinking": text["text"]}
        return {"type": "redacted_thinking"}
    if kind == "guardContent" and isinstance(value.get("text"), Mapping):
        return {"type": "text", "text": str(value["text"].get("text", ""))}
    if kind in ("image", "document"):
        return _media(kind, value, where, view)
    view.estimate(f"{where}: {kind} counted as its JSON")
    return {"type": f"converse:{kind}", kind: value}


def _result_block(block: object, where: str, view: ViewBuilder) -> dict[str, Any]:
    if isinstance(block, Mapping) and len(block) == 1 and "json" in block:
        return {"type": "text", "text": json.dumps(block["json"], ensure_ascii=False)}
    return _block(block, where, view)


def _media(kind: str, value: Mapping[str, Any], where: str, view: ViewBuilder) -> dict[str, Any]:
    """An image or document with its bytes (base64 in the JSON) as Anthropic's base64 block; a
    text document as its text; one held in S3 priced at the most such a block can cost."""
    source = value.get("source")
    source = source if isinstance(source, Mapping) else {}
    fmt = str(value.get("format", "")).lower()
    if isinstance(source.get("text"), str):
        return {"type": "document", "source": {"type": "text", "data": source["text"]}}
    data = source.get("bytes")
    if not isinstance(data, str):
        view.estimate(f"{where}: a {kind} held in S3 or given as blocks, counted at the most it can cost")
        return (
            {"type": kind, "source": {"type": "file"}} if kind == "image" else {"type": f"converse:{kind}", kind: value}
        )
    if kind == "document" and fmt in _TEXT_DOCUMENTS:
        try:
            return {
                "type": "document",
                "source": {"type": "text", "data": base64.b64decode(data).decode("utf-8", "replace")},
            }
        except (binascii.Error, ValueError):
            raise InvalidRequest(f"{where}.source.bytes: must be base64", param=f"{where}.source.bytes") from None
    media = _MEDIA.get(fmt, "application/pdf" if fmt == "pdf" else "application/octet-stream")
    return {"type": kind, "source": {"type": "base64", "media_type": media, "data": data}}


def _tools(config: object) -> list[dict[str, Any]] | None:
    """`toolConfig.tools[].toolSpec` as Messages tools; a cachePoint among them counts nothing."""
    if config is None:
        return None
    tools = config.get("tools") if isinstance(config, Mapping) else None
    if not isinstance(tools, list):
        raise InvalidRequest("toolConfig.tools: must be an array", param="toolConfig.tools")
    converted = []
    for tool in tools:
        spec = tool.get("toolSpec") if isinstance(tool, Mapping) else None
        if not isinstance(spec, Mapping):
            continue
        schema = spec.get("inputSchema")
        schema = schema.get("json") if isinstance(schema, Mapping) else None
        entry = {"name": spec.get("name"), "input_schema": schema if schema is not None else {}}
        if isinstance(spec.get("description"), str):
            entry["description"] = spec["description"]
        converted.append(entry)
    return converted


def _max_tokens(config: object) -> int | None:
    if config is None:
        return None
    value = config.get("maxTokens") if isinstance(config, Mapping) else None
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidRequest(
            "'inferenceConfig.maxTokens' must be a positive integer", param="inferenceConfig.maxTokens"
        )
    return value


def _write_back(
    body: dict[str, Any], messages: list[Any], source: Source, old: Mapping[str, Any], new: Mapping[str, Any]
) -> None:
    """Put the text trimming shortened back into the Converse blocks it came from."""
    origin = source.origins[0]
    if origin.field == "system":
        body["system"] = _write_blocks(list(body["system"]), source, old, new)
        return
    if origin.index is None:
        return
    message = messages[origin.index]
    blocks = list(message["content"])
    if origin.block is not None and old.get("role") == "tool":  # a toolResult block
        result = blocks[origin.block]["toolResult"]
        content = new.get("content")
        inner = (
            [{"text": content}]
            if isinstance(content, str)
            else _write_blocks(list(result.get("content", [])), source, old, new)
        )
        blocks[origin.block] = {"toolResult": {**result, "content": inner}}
    else:
        blocks = _write_blocks(blocks, source, old, new)
    messages[origin.index] = {**message, "content": blocks}


def _write_blocks(blocks: list[Any], source: Source, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Any]:
    old_parts, new_parts = old.get("content"), new.get("content")
    if not isinstance(old_parts, list) or not isinstance(new_parts, list):
        return blocks
    for j, text in shortened_texts(old_parts, new_parts):
        target = source.parts[j] if j < len(source.parts) else None
        if target is not None:
            blocks[target] = {"text": text}  # a shortened text, document or JSON result, or an image's marker
    return blocks
