"""Google's Interactions API (`POST /v1beta/interactions`, `/v1/interactions`; on Vertex AI
`/v1beta1/projects/{p}/locations/{l}/interactions`) as the core's chat view.

    system_instruction                -> a system message (pinned)
    input                             -> the view's messages (`proxy.apis.gemini.interaction_steps`)
    tools                             -> chat tools (function tools; built-in ones as their JSON)
    generation_config.tool_choice     -> counted with the tools, as its JSON
    generation_config.max_output_tokens -> the output reserve
    response_format                   -> the response format (its schema counted)
    previous_interaction_id           -> held context: the earlier interaction the provider keeps
                                         (`HeldContext("interaction", id)`)
    cached_content                    -> held context: the cached prompt
    store, stream, background, ...    -> forwarded untouched (`store` is true unless the client
                                         says otherwise: the guard never sets it)

The model is the body's `model`, as the client spells it or as Google's resource name
(`models/gemini-2.5-flash`: the last segment is the model). An agent interaction (`agent`, no
`model`) runs a model and tools the request does not name: the guard cannot count it and says so.
Rendering writes the cut back into `input`: dropped steps go, a shortened text replaces only its
`text` (or a function result its `result`), and a message the trim added becomes a `user_input`
step where the dropped steps were; every other step and field stays as sent. Errors take the
Interactions API's shape, `{"error": {"code", "message"}}` with a snake_case code, which
google-genai's `interactions` raise with the message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar

from proxy.apis.base import (
    Adapter,
    Changes,
    HeldContext,
    InvalidRequest,
    Origin,
    Parsed,
    ViewBuilder,
    require_object,
    shortened_texts,
)
from proxy.apis.cut_positions import dropped_origins, inserted_texts
from proxy.apis.endpoints import Endpoint, Shape, ShapeOptions
from proxy.apis.fields import NOTHING_KNOWN, KnownPrefix
from proxy.apis.gemini.gemini_parts import field, google_overflow, with_output_reserve
from proxy.apis.gemini.interaction_steps import Steps, chat_tools, content_parts, is_content
from proxy.apis.stream_errors import interactions_broken
from proxy.core.trimming.budget import TrimResult
from proxy.errors import GuardError

API = "interactions"
ACCOUNTED = frozenset(
    {
        "model", "input", "system_instruction", "systemInstruction", "tools", "generation_config",
        "generationConfig", "response_format", "response_mime_type", "response_modalities", "safety_settings",
        "service_tier", "store", "stream", "background", "labels", "previous_interaction_id", "cached_content",
        "webhook_config",
    }
)  # fmt: skip
# The Interactions API's error codes by HTTP status (ai.google.dev/gemini-api/docs/api-errors).
CODES = {
    400: "invalid_request",
    401: "authentication",
    403: "permission_denied",
    404: "not_found",
    405: "invalid_request",
    408: "deadline_exceeded",
    413: "invalid_request",
    429: "rate_limit_exceeded",
    499: "cancelled",
    500: "internal",
    502: "unavailable",
    503: "unavailable",
    504: "deadline_exceeded",
}


def interactions_error(status: int, message: str) -> dict[str, Any]:
    """An error in the Interactions API's shape."""
    return {"error": {"code": CODES.get(status, "unknown"), "message": message}}


class InteractionsAdapter(Adapter):
    name: ClassVar[str] = API
    writes_inserted: ClassVar[bool] = True
    accounted: ClassVar[frozenset[str]] = ACCOUNTED
    reserve_field: ClassVar[str | None] = "generation_config.max_output_tokens"
    reserve_view_field: ClassVar[str | None] = "max_tokens"

    def parse(self, body: object, known: KnownPrefix = NOTHING_KNOWN) -> Parsed:
        body = require_object(body)
        model = _model(body)
        view = ViewBuilder()
        system = field(body, "systemInstruction")
        if isinstance(system, str):
            if system:
                view.add({"role": "system", "content": system}, (Origin("system_instruction"),))
        elif system is not None:
            raise InvalidRequest("system_instruction: must be a string", param="system_instruction")
        _read_input(body.get("input"), view)
        chat: dict[str, Any] = {"messages": view.messages, "model": model}
        unseen: list[str] = []
        tools = chat_tools(body.get("tools"), view, unseen)
        if tools:
            chat["tools"] = tools
        generation = field(body, "generationConfig")
        if generation is not None and not isinstance(generation, Mapping):
            raise InvalidRequest("generation_config: must be an object", param="generation_config")
        choice = field(generation or {}, "toolChoice")
        if choice is not None:
            chat["tool_choice"] = choice  # counted as its JSON with the tools
        reserve = _reserve(generation or {})
        if reserve is not None:
            chat["max_tokens"] = reserve
        schema = body.get("response_format")
        if schema is not None:
            chat["response_format"] = {"type": "json_schema", "json_schema": {"schema": schema}}
        for key, kind in (("previous_interaction_id", "interaction"), ("cached_content", "cache")):
            held = body.get(key)
            if held is not None:
                context = HeldContext(kind, held) if isinstance(held, str) else None
                view.provider_holds(f"{key}: the context the provider holds is not counted", context)
        parsed = view.parsed(self, body, chat, model)
        return replace(parsed, reserve_view_field="max_tokens" if reserve is not None else None, unseen=tuple(unseen))

    def write_reserve(self, body: dict[str, Any], parsed: Parsed, reserve: int) -> None:
        with_output_reserve(body, reserve, snake=True)

    def error_body(self, error: GuardError) -> dict[str, Any]:
        return interactions_error(error.status, error.named_message)

    def overflow_refusal(self, result: TrimResult) -> tuple[str, str | None]:
        return google_overflow(result), None

    def broken_stream_event(self, message: str) -> bytes:
        return interactions_broken(message)

    def _render(self, parsed: Parsed, changes: Changes) -> dict[str, Any]:
        body = dict(parsed.body)
        raw = body.get("input")
        items: list[Any] = list(raw) if isinstance(raw, list) else []
        for i, new in changes.replaced.items():
            origin = parsed.sources[i].origins[-1]
            content = new.get("content")
            if origin.field == "system_instruction" and isinstance(content, str):
                key = "system_instruction" if "system_instruction" in body else "systemInstruction"
                body[key] = content
            elif origin.field == "input" and origin.index is None:
                body["input"] = _written(raw, parsed.sources[i].parts, parsed.messages[i], new)
            elif origin.field == "input" and origin.index is not None:
                items[origin.index] = _written_step(items[origin.index], parsed, i, new)
        if not isinstance(raw, list) or is_content(raw[0] if raw else None):
            return body
        whole, _ = dropped_origins(parsed, changes, "input")
        notes = inserted_texts(parsed, changes, "input", len(items))
        out: list[Any] = []
        for k, item in enumerate([*items, None]):
            out += [{"type": "user_input", "content": [{"type": "text", "text": t}]} for t in notes.get(k, ())]
            if item is not None and k not in whole:
                out.append(item)
        body["input"] = out
        return body


def _model(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if model is None and body.get("agent") is not None:
        raise InvalidRequest(
            "context-guard counts interactions with a model; an agent interaction runs a model and tools the "
            "request does not name, so it cannot be counted: send `model`",
            param="agent",
        )
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model: a non-empty string is required", param="model")
    # Google's resource names (`models/x`, `projects/p/locations/l/publishers/google/models/x`): the model is `x`.
    return model.rpartition("/")[2] if model.startswith(("models/", "projects/", "publishers/")) else model


def _read_input(value: object, view: ViewBuilder) -> None:
    if value is None:
        return
    if isinstance(value, str):
        view.add({"role": "user", "content": value}, (Origin("input"),))
        return
    if is_content(value) or (isinstance(value, list) and value and all(is_content(v) for v in value)):
        contents = value if isinstance(value, list) else [value]
        parts = content_parts(contents, view, "input")
        view.add({"role": "user", "content": parts}, (Origin("input"),), tuple(range(len(parts))))
        return
    if not isinstance(value, list):
        raise InvalidRequest("input: must be a string, a content, or a list of contents or steps", param="input")
    steps = Steps(view)
    for k, step in enumerate(value):
        steps.read(step, k)
    steps.finish()


def _reserve(generation: Mapping[str, Any]) -> int | None:
    value = field(generation, "maxOutputTokens")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        where = "generation_config.max_output_tokens"
        raise InvalidRequest(f"{where}: must be a positive integer", param=where)
    return value


def _written(original: object, parts: Sequence[int | None], old: Mapping[str, Any], new: Mapping[str, Any]) -> Any:
    """The `input` (a text, a content or contents) with the texts the trim shortened."""
    content = new.get("content")
    if isinstance(original, str):
        return content if isinstance(content, str) else original
    contents = list(original) if isinstance(original, list) else [original]
    written = _written_contents(contents, parts, old, new)
    return written if isinstance(original, list) else written[0]


def _written_step(step: Mapping[str, Any], parsed: Parsed, i: int, new: Mapping[str, Any]) -> dict[str, Any]:
    old, content = parsed.messages[i], new.get("content")
    if step.get("type") == "function_result":
        return {**step, "result": content} if isinstance(content, str) else dict(step)
    contents = step.get("content")
    if not isinstance(contents, list):
        return dict(step)
    return {**step, "content": _written_contents(list(contents), parsed.sources[i].parts, old, new)}


def _written_contents(
    contents: list[Any], parts: Sequence[int | None], old: Mapping[str, Any], new: Mapping[str, Any]
) -> list[Any]:
    old_parts, new_parts = old.get("content"), new.get("content")
    if isinstance(new_parts, str) and isinstance(old_parts, list):  # a whole message shortened to one text
        new_parts = [{"type": "text", "text": new_parts}] + [{"type": "text", "text": ""}] * (len(old_parts) - 1)
    if not isinstance(old_parts, list) or not isinstance(new_parts, list):
        return contents
    for j, text in shortened_texts(old_parts, new_parts):
        target = parts[j] if j < len(parts) else None
        if target is None:
            continue
        before = contents[target]
        # A shortened text keeps its other fields; a medium cut to a marker becomes that text.
        contents[target] = {**before, "text": text} if before.get("type") == "text" else {"type": "text", "text": text}
    return contents


# Vertex AI's: a project's and location's (google-genai with vertexai=True sends v1beta1).
_VERTEX_INTERACTIONS = re.compile(r"/(?:v1|v1beta1)/projects/[^/]+/locations/[^/]+/interactions")


def shape(options: ShapeOptions) -> Shape:
    """Google's Interactions API on the Developer API's versions (google-genai sends `/v1`) and
    Vertex AI's, sent to the upstream's host under the path as written."""
    adapter = InteractionsAdapter()
    endpoint = Endpoint(adapter, at_host_root=True)
    exact = {f"/{version}/interactions": endpoint for version in ("v1", "v1beta", "v1alpha")}

    def vertex(path: str) -> Endpoint | None:
        return endpoint if _VERTEX_INTERACTIONS.fullmatch(path) else None

    return Shape(adapter.name, (adapter,), exact, vertex, lambda segments: segments[-1:] == ("interactions",))
