"""Gemini's `generateContent` (`streamGenerateContent`, `countTokens`) as the core's chat view, on
the Gemini Developer API and on Vertex AI's native paths alike.

    systemInstruction                  -> a system message (pinned)
    contents (user and model turns)    -> the view's messages (`proxy.apis.gemini.gemini_parts`): a model
                                          turn's function calls and the functionResponse parts
                                          answering them are one atomic unit, kept or dropped whole
    tools[].functionDeclarations       -> chat function tools (`parameters` or
                                          `parametersJsonSchema` as the parameters); hosted tools
                                          (googleSearch, codeExecution, urlContext, ...) counted
                                          as their JSON, and what they fetch is not seen
    toolConfig                         -> counted with the tools, as its JSON
    generationConfig.maxOutputTokens   -> the output reserve (a thinking budget, when no
                                          maxOutputTokens is given); responseSchema as the
                                          response format
    cachedContent                      -> server state: the cached prompt is the provider's

The model comes from the path (`models/{model}:generateContent`), checked by `model_name` before
anything uses it. Rendering writes the cut back into the original JSON: dropped turns and parts
go, a shortened text replaces only its `text`, and every part it did not cut, a model turn's
function calls and their `thoughtSignature` among them, stays the very object the client sent. A
message the trim added (the budget note) becomes a text part opening the user turn after the
dropped ones. Errors take Google's shape, `{"error": {"code", "message", "status"}}`, which
`google.genai.errors.ClientError` reads, and the guard's refusal opens with Gemini's own sentence.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, ClassVar

from proxy.apis import fields
from proxy.apis.base import (
    Adapter,
    Changes,
    HeldContext,
    InvalidRequest,
    Parsed,
    Source,
    ViewBuilder,
    require_object,
    shortened_texts,
)
from proxy.apis.cut_positions import dropped_origins, inserted_texts
from proxy.apis.endpoints import Endpoint, Shape, ShapeOptions
from proxy.apis.fields import NOTHING_KNOWN, KnownPrefix
from proxy.apis.gemini.gemini_parts import Turns, field, google_overflow, read_system, with_output_reserve
from proxy.apis.gemini.google_paths import generation_method
from proxy.apis.stream_errors import google_broken
from proxy.core.models.model_names import url_model_name
from proxy.core.trimming.budget import TrimResult
from proxy.errors import GuardError

API = "generate_content"
COUNT_API = "generate_content.count_tokens"
# Tools whose results the provider puts in the prompt without the request showing them.
HOSTED_TOOLS = frozenset(
    {
        "googleSearch", "googleSearchRetrieval", "codeExecution", "urlContext", "retrieval", "googleMaps",
        "enterpriseWebSearch", "fileSearch", "computerUse",
        "google_search", "google_search_retrieval", "code_execution", "url_context", "google_maps",
        "enterprise_web_search", "file_search", "computer_use",
    }
)  # fmt: skip
# Google's canonical status per HTTP status (google.rpc.Code, as its APIs answer them).
STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}


def model_name(name: str) -> str:
    """The model a Gemini path names, refused unless it is one plain URL segment
    (proxy.core.models.model_names: it goes into the upstream's URL and the count endpoint's)."""
    if url_model_name(name) is None:
        raise InvalidRequest(
            "the model in the path must be a name of letters, digits, '.', '_', '@' and '-',"
            " starting and ending with a letter or digit",
            param="model",
        )
    return name


def gemini_error(status: int, message: str) -> dict[str, Any]:
    """An error in Google's shape."""
    return {"error": {"code": status, "message": message, "status": STATUSES.get(status, "UNKNOWN")}}


def overflow_sentence(tokens: int, allowed: int) -> str:
    """Gemini's own words for a prompt over the limit (clients and the guard's corrections know them)."""
    return f"The input token count ({tokens}) exceeds the maximum number of tokens allowed ({allowed})."


def count_tokens_answer(total: int) -> dict[str, int]:
    """The answer of `:countTokens`."""
    return {"totalTokens": total}


class GenerateContentAdapter(Adapter):
    name: ClassVar[str] = API
    writes_inserted: ClassVar[bool] = True
    accounted: ClassVar[frozenset[str]] = fields.GEMINI
    reserve_field: ClassVar[str | None] = "generationConfig.maxOutputTokens"
    reserve_view_field: ClassVar[str | None] = "max_tokens"  # None in the `Parsed` of a body that sets none

    def parse(self, body: object, known: KnownPrefix = NOTHING_KNOWN) -> Parsed:
        body = require_object(body)
        view = ViewBuilder()
        generation = field(body, "generationConfig")
        if generation is not None and not isinstance(generation, Mapping):
            raise InvalidRequest("generationConfig: must be an object", param="generationConfig")
        resolution = field(generation or {}, "mediaResolution")
        resolution = resolution if isinstance(resolution, str) and resolution else "high"
        read_system(field(body, "systemInstruction"), view, resolution)
        contents = body.get("contents")
        if not isinstance(contents, list):
            raise InvalidRequest("contents: must be a list of Content objects", param="contents")
        turns = Turns(view, resolution)
        for i, content in enumerate(contents):
            turns.read(content, i)
        chat: dict[str, Any] = {"messages": view.messages}
        unseen: list[str] = []
        tools = _tools(field(body, "tools"), view, unseen)
        if tools:
            chat["tools"] = tools
        config = field(body, "toolConfig")
        if config is not None:
            chat["tool_choice"] = config  # counted as its JSON with the tools
        reserve = _reserve(generation or {})
        if reserve is not None:
            chat["max_tokens"] = reserve
        schema = field(generation or {}, "responseJsonSchema") or field(generation or {}, "responseSchema")
        if schema is not None:
            chat["response_format"] = {"type": "json_schema", "json_schema": {"schema": schema}}
        cached = field(body, "cachedContent")
        if cached is not None:
            held = HeldContext("cache", cached) if isinstance(cached, str) else None
            view.provider_holds("cachedContent: the cached prompt lives on the provider and is not counted", held)
        parsed = view.parsed(self, body, chat, None)
        return replace(parsed, reserve_view_field="max_tokens" if reserve is not None else None, unseen=tuple(unseen))

    def write_reserve(self, body: dict[str, Any], parsed: Parsed, reserve: int) -> None:
        with_output_reserve(body, reserve, snake=False)

    def error_body(self, error: GuardError) -> dict[str, Any]:
        return gemini_error(error.status, error.named_message)

    def overflow_refusal(self, result: TrimResult) -> tuple[str, str | None]:
        return google_overflow(result), None

    def broken_stream_event(self, message: str) -> bytes:
        return google_broken(message)

    def _render(self, parsed: Parsed, changes: Changes) -> dict[str, Any]:
        body = dict(parsed.body)
        contents: list[Any] = list(body["contents"])
        for i, new in changes.replaced.items():
            _write_back(body, contents, parsed.sources[i], parsed.messages[i], new)
        whole, parts = dropped_origins(parsed, changes, "contents")
        notes = inserted_texts(parsed, changes, "contents", len(contents))
        kept: list[tuple[int, Mapping[str, Any]]] = []
        for k, content in enumerate([*contents, None]):
            if k in notes:
                note = {"role": "user", "parts": [{"text": text} for text in notes[k]]}
                kept.append((-2, note))  # no turn's neighbour: joined with the user turn after it
            if content is None or k in whole:
                continue
            if k in parts:
                left = [p for j, p in enumerate(content["parts"]) if j not in parts[k]]
                if not left:
                    continue
                content = {**content, "parts": left}
            kept.append((k, content))
        body["contents"] = _joined(kept)
        return body


class CountTokensAdapter(GenerateContentAdapter):
    """`:countTokens`: a generateContent body, or one wrapped as `generateContentRequest` (the
    Developer API's form), answered locally with `count_tokens_answer(total)`."""

    name: ClassVar[str] = COUNT_API

    def parse(self, body: object, known: KnownPrefix = NOTHING_KNOWN) -> Parsed:
        body = require_object(body)
        inner = field(body, "generateContentRequest")
        if inner is not None:
            if not isinstance(inner, Mapping):
                raise InvalidRequest("generateContentRequest: must be an object", param="generateContentRequest")
            return super().parse(inner, known)
        return super().parse(body, known)


def _reserve(generation: Mapping[str, Any]) -> int | None:
    """The output the request asks room for: maxOutputTokens, else a positive thinking budget."""
    value = field(generation, "maxOutputTokens")
    if value is not None:
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            where = "generationConfig.maxOutputTokens"
            raise InvalidRequest(f"{where}: must be a positive integer", param=where)
        return value
    thinking = field(generation, "thinkingConfig")
    budget = field(thinking, "thinkingBudget") if isinstance(thinking, Mapping) else None
    return budget if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0 else None


def _tools(tools: object, view: ViewBuilder, unseen: list[str]) -> list[Any]:
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise InvalidRequest("tools: must be a list", param="tools")
    converted: list[Any] = []
    for j, tool in enumerate(tools):
        if not isinstance(tool, Mapping):
            raise InvalidRequest(f"tools[{j}]: must be an object", param=f"tools[{j}]")
        declarations = field(tool, "functionDeclarations")
        if declarations is not None and not isinstance(declarations, list):
            raise InvalidRequest(f"tools[{j}].functionDeclarations: must be a list", param=f"tools[{j}]")
        for k, declaration in enumerate(declarations or ()):
            if not isinstance(declaration, Mapping) or not isinstance(declaration.get("name"), str):
                where = f"tools[{j}].functionDeclarations[{k}]"
                raise InvalidRequest(f"{where}.name: must be a string", param=where)
            function: dict[str, Any] = {"name": declaration["name"]}
            if isinstance(declaration.get("description"), str):
                function["description"] = declaration["description"]
            parameters = field(declaration, "parametersJsonSchema") or declaration.get("parameters")
            if parameters is not None:
                function["parameters"] = parameters
            response = field(declaration, "responseJsonSchema") or declaration.get("response")
            if response is not None:  # shown to the model beside the declaration
                function["description"] = f"{function.get('description', '')}\n\nReturns: {response}".lstrip()
            converted.append({"type": "function", "function": function})
        others = {k: v for k, v in tool.items() if k not in ("functionDeclarations", "function_declarations")}
        if others:
            view.estimate(f"tools[{j}]: {', '.join(sorted(others))[:80]} counted as JSON")
            converted.append(others)
            unseen += (f"tools[{j}].{name}: what the hosted tool fetches" for name in others if name in HOSTED_TOOLS)
    return converted


def _write_back(
    body: dict[str, Any], contents: list[Any], source: Source, old: Mapping[str, Any], new: Mapping[str, Any]
) -> None:
    """Put the text trimming shortened back into the parts it came from, and nothing else."""
    origin = source.origins[0]
    content = new.get("content")
    if origin.field == "systemInstruction":
        system = field(body, "systemInstruction")
        key = "systemInstruction" if "systemInstruction" in body else "system_instruction"
        if isinstance(system, str) and isinstance(content, str):
            body[key] = content
        elif isinstance(system, Mapping):
            body[key] = {**system, "parts": _write_parts(system.get("parts", []), source, old, new)}
        return
    if origin.index is None:
        return
    turn = contents[origin.index]
    if old.get("role") == "tool" and origin.block is not None:  # a functionResponse, shortened
        parts = list(turn["parts"])
        part = parts[origin.block]
        key = "functionResponse" if "functionResponse" in part else "function_response"
        if isinstance(content, str):
            parts[origin.block] = {**part, key: {**part[key], "response": {"output": content}}}
            contents[origin.index] = {**turn, "parts": parts}
        return
    contents[origin.index] = {**turn, "parts": _write_parts(turn["parts"], source, old, new)}


def _write_parts(parts: Sequence[Any], source: Source, old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Any]:
    out = list(parts)
    old_parts, new_parts = old.get("content"), new.get("content")
    if isinstance(new_parts, str) and isinstance(old_parts, list):  # a whole message shortened to one text
        new_parts = [{"type": "text", "text": new_parts}] + [{"type": "text", "text": ""}] * (len(old_parts) - 1)
    if not isinstance(old_parts, list) or not isinstance(new_parts, list):
        return out
    for j, text in shortened_texts(old_parts, new_parts):
        target = source.parts[j] if j < len(source.parts) else None
        if target is None:
            continue
        part = out[target]
        out[target] = {**part, "text": text} if "text" in part else {"text": text}  # an image: its marker
    return out


def _joined(kept: list[tuple[int, Mapping[str, Any]]]) -> list[Any]:
    """The kept turns, two user turns that a drop (or a note) left side by side joined into one."""
    out: list[tuple[int, Mapping[str, Any]]] = []
    for k, content in kept:
        if out and out[-1][0] != k - 1 and _role(out[-1][1]) == "user" == _role(content):
            first = out[-1][1]
            out[-1] = (k, {**first, "parts": [*first.get("parts", []), *content.get("parts", [])]})
        else:
            out.append((k, content))
    return [content for _, content in out]


def _role(content: Mapping[str, Any]) -> str:
    role = content.get("role", "user")
    return "user" if role == "function" else str(role)


# The Developer API (`v1`, `v1beta`) and Vertex AI's publisher models (`v1`, `v1beta1`; regional and
# global locations, and express mode's paths without a project). The model is any segment here,
# checked when the request is parsed: a loose match, so that no spelling of these paths falls
# through to pass-through uncounted.
_GEMINI = re.compile(
    r"/(?:v1|v1beta|v1alpha)/models/(?P<model>[^/:]+):(?P<method>generateContent|streamGenerateContent|countTokens)"
    r"|/(?:v1|v1beta1)/(?:projects/[^/]+/locations/[^/]+/)?publishers/google/models/(?P<vmodel>[^/:]+)"
    r":(?P<vmethod>generateContent|streamGenerateContent|countTokens)"
)


def shape(options: ShapeOptions) -> Shape:
    """Gemini's generateContent (the Developer API's and Vertex AI's), sent to the upstream's host
    under the path as written; `:countTokens` answered locally."""
    adapter, count = GenerateContentAdapter(), CountTokensAdapter()

    def models(path: str) -> Endpoint | None:
        found = _GEMINI.fullmatch(path)
        if found is None:
            return None
        model, method = found["model"] or found["vmodel"], found["method"] or found["vmethod"]
        if method == "countTokens":
            answer = count_tokens_answer
            return Endpoint(count, model, local=True, answer=answer, at_host_root=True, model_check=model_name)
        stream = method == "streamGenerateContent"
        return Endpoint(adapter, model, stream=stream, at_host_root=True, model_check=model_name)

    return Shape(adapter.name, (adapter, count), {}, models, lambda segments: generation_method(segments) is not None)
