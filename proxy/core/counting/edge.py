"""The provider's own count at the edge of the budget: when to ask it, where, and how to read it.

A count that is not exact is an upper bound. A tokenizer that is a bound may also say how far
above the real count it can be (`Bounded.bound_ratio`: real >= count / ratio), which gives a lower
bound. When the two straddle the budget (the lower fits, the upper does not), the guard cannot
tell whether the request fits: it asks the upstream's count endpoint once, and that count decides.
Away from the edge nothing is asked: a request whose upper bound fits is sent, one whose lower
bound does not fit is cut.

The endpoints (their documented shapes):
- Anthropic: `POST /v1/messages/count_tokens`, the Messages body without `max_tokens` and the
  sampling fields; answers `{"input_tokens": N}`.
- OpenAI: `POST /v1/responses/input_tokens`, a Responses body (a chat body is rewritten as one);
  answers `{"object": "response.input_tokens", "input_tokens": N}`.
- Vertex AI: `POST .../publishers/google/models/{model}:countTokens` with `contents`,
  `systemInstruction` and `tools`; answers `{"totalTokens": N}`. A native Gemini request
  (`generate_content`) goes as it is, less its generation settings. In express mode (an API
  key, the global host, no project: a base URL without `/projects/`) the same call is
  `POST /v1/publishers/google/models/{model}:countTokens` at the base's host (`/v1beta1/...`
  when the base says `v1beta1`; Google's "Vertex AI in express mode REST API reference").
- Gemini Developer API: `POST /v1beta/models/{model}:countTokens` with the whole request as its
  `generateContentRequest`; answers `{"totalTokens": N}`.
- vLLM and llama.cpp count through their tokenize endpoints (`proxy.server.backends.tokenize`).

Pure: the shell (`proxy.server.backends.provider_count`) performs the call and caches the answer.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable
from urllib.parse import quote

from proxy.core.models.model_names import url_model_name

EndpointKind = Literal["anthropic", "openai", "vertex", "gemini", "bedrock"]


@runtime_checkable
class Bounded(Protocol):
    """A tokenizer whose counts are upper bounds with a documented worst case: the real count is
    at least `count / bound_ratio`. None: no lower bound is known (an exact tokenizer needs none)."""

    @property
    def bound_ratio(self) -> float | None: ...


def lower_bound(count: int, exact: bool, ratio: float | None) -> int | None:
    """The least the real count can be, for a count made by a tokenizer that is `exact` or bounds
    it within `ratio`; None when nothing is known below the count."""
    if exact:
        return count
    if ratio is None or ratio < 1.0:
        return None
    return math.floor(count / ratio)


def bound_ratio_of(tokenizer: object, assumed: float | None = None, stated: float | None = None) -> float | None:
    """The tokenizer's own `bound_ratio` (else `stated`: the model family's, for a tokenizer that is
    its vocabulary, `Family.bound_ratio`) or the operator's `assumed` one, the larger when both are
    known: a larger ratio only widens the band where the provider is asked, never cuts more."""
    ratio = getattr(tokenizer, "bound_ratio", None)
    if not isinstance(ratio, (int, float)) or isinstance(ratio, bool):
        ratio = stated
    if isinstance(ratio, (int, float)) and not isinstance(ratio, bool) and ratio >= 1.0:
        return max(float(ratio), assumed) if assumed is not None else float(ratio)
    return assumed


def straddles(upper: int, lower: int | None, budget: int) -> bool:
    """True when the request may fit or not: its lower bound fits the budget, its upper does not."""
    return lower is not None and lower <= budget < upper


@dataclass(frozen=True, slots=True)
class CountCall:
    """One request to a count endpoint, and the field of its answer that holds the count."""

    kind: EndpointKind
    url: str
    body: Mapping[str, Any]
    answer_field: str

    def key(self, upstream: str, model: str) -> str:
        """What a cached answer is kept under: the upstream, the model, the URL and the body's digest."""
        return body_key(upstream, model, self.url, self.body)


def body_key(upstream: str, model: str, url: str, body: Mapping[str, Any]) -> str:
    """A cache key for a count of `body` asked of `url`: equal bodies (in any key order) share it."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{upstream}\x00{model}\x00{url}\x00{digest}"


def bytes_key(upstream: str, model: str, url: str, data: bytes) -> str:
    """A cache key for a count of the serialised body `data` asked of `url`: its digest, with no
    re-serialisation (the shell computes it where it serialises the body, off the event loop)."""
    return f"{upstream}\x00{model}\x00{url}\x00{hashlib.sha256(data).hexdigest()}"


def read_count(call: CountCall, answer: object) -> int | None:
    """The count in an endpoint's answer; None for an answer without one."""
    value = answer.get(call.answer_field) if isinstance(answer, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


# What each count endpoint reads of a request; the rest (max_tokens, sampling) it refuses or ignores.
_ANTHROPIC_FIELDS = ("model", "messages", "system", "tools", "tool_choice", "thinking", "mcp_servers")
_RESPONSES_FIELDS = (
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "reasoning",
    "text",
    "truncation",
    "conversation",
    "previous_response_id",
)
_VERTEX_BASE = re.compile(r"^(https?://[^/]+/v1(?:beta1)?/projects/[^/]+/locations/[^/]+)(?:/|$)")
_HOST_AND_PATH = re.compile(r"^(https?://[^/?#]+)([^?#]*)")


def _vertex_models(base: str) -> str | None:
    """Where Vertex AI's publisher models are for an upstream at `base`: under the base's project
    and location, or in express mode (no project in the base) under the host's `/v1` (`/v1beta1`
    when the base's path starts with it); None for a base that is neither."""
    found = _VERTEX_BASE.match(base)
    if found is not None:
        return f"{found.group(1)}/publishers/google/models"
    split = _HOST_AND_PATH.match(base)
    if split is None or "/projects/" in f"{split.group(2)}/":
        return None
    version = "v1beta1" if re.match(r"/v1beta1(?:/|$)", split.group(2)) else "v1"
    return f"{split.group(1)}/{version}/publishers/google/models"


def count_call(kind: str, base_url: str, model: str, api: str, body: Mapping[str, Any]) -> CountCall | None:
    """The call that counts `body` (in the shape of `api`) on an upstream of `kind` at `base_url`;
    None when that upstream has no count endpoint for it (or the body cannot be said in its shape)."""
    base = base_url.rstrip("/")
    if kind == "anthropic" and api == "messages":
        root = base[: -len("/v1")] if base.endswith("/v1") else base
        picked = {k: body[k] for k in _ANTHROPIC_FIELDS if k in body}
        return CountCall("anthropic", f"{root}/v1/messages/count_tokens", {**picked, "model": model}, "input_tokens")
    if kind == "openai" and api in ("responses", "chat"):
        request = dict(body) if api == "responses" else responses_body(body)
        if request is None:
            return None
        picked = {k: request[k] for k in _RESPONSES_FIELDS if k in request}
        return CountCall("openai", f"{base}/responses/input_tokens", {**picked, "model": model}, "input_tokens")
    if api == "generate_content" and kind in ("vertex", "gemini"):
        return _gemini_call(kind, base, model, body)
    if kind == "bedrock" and api in ("converse", "invoke"):
        return _bedrock_call(base, model, api, body)
    if kind == "vertex" and api == "chat":  # the OpenAI-compatible endpoint: a project's only
        found = _VERTEX_BASE.match(base)
        contents = vertex_body(body)
        if found is None or contents is None:
            return None
        # The model is written into the URL: a name that is not one plain path segment is never asked about.
        name = url_model_name(model.split("/", 1)[1] if model.startswith("google/") else model)
        if name is None:
            return None
        url = f"{found.group(1)}/publishers/google/models/{name}:countTokens"
        return CountCall("vertex", url, contents, "totalTokens")
    return None


# What Gemini's countTokens reads of a generateContent request (Vertex AI takes them at the top level).
_GEMINI_FIELDS = ("contents", "systemInstruction", "system_instruction", "tools", "toolConfig", "tool_config")


def _gemini_call(kind: str, base: str, model: str, body: Mapping[str, Any]) -> CountCall | None:
    """The countTokens call for a native Gemini request: the model, a plain name (quoted all the
    same), put in a URL at the upstream's host; for Vertex AI under the base URL's project, or
    express mode's path when the base names none (`_vertex_models`)."""
    name = url_model_name(model.rpartition("/")[2])
    if name is None:
        return None
    quoted = quote(name, safe="")
    picked = {k: body[k] for k in _GEMINI_FIELDS if k in body}
    if kind == "gemini":
        root = re.sub(r"^(https?://[^/]+).*$", r"\1", base)
        request = {"generateContentRequest": {**picked, "model": f"models/{name}"}}
        return CountCall("gemini", f"{root}/v1beta/models/{quoted}:countTokens", request, "totalTokens")
    models = _vertex_models(base)
    if models is None:
        return None
    return CountCall("vertex", f"{models}/{quoted}:countTokens", picked, "totalTokens")


# What Bedrock's CountTokens reads of a Converse request.
_CONVERSE_FIELDS = ("messages", "system", "toolConfig", "additionalModelRequestFields")


def _bedrock_call(base: str, model: str, api: str, body: Mapping[str, Any]) -> CountCall:
    """Bedrock's CountTokens for the foundation model a profile's id names (it counts for foundation
    models): a Converse request's fields, or an InvokeModel body whole (a blob: base64 of its JSON)."""
    foundation = quote(_BEDROCK_GEOGRAPHY.sub("", model), safe="")
    if api == "converse":
        counted: dict[str, Any] = {"converse": {k: body[k] for k in _CONVERSE_FIELDS if k in body}}
    else:
        data = json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass")
        counted = {"invokeModel": {"body": base64.b64encode(data).decode("ascii")}}
    return CountCall("bedrock", f"{base}/model/{foundation}/count-tokens", {"input": counted}, "inputTokens")


_BEDROCK_GEOGRAPHY = re.compile(r"^(?:us|us-gov|eu|apac|jp|au|ca|global)\.(?=[a-z0-9-]+\.[a-z0-9])")


def _text(content: object) -> str | None:
    """A message's content as text; None when it holds anything but text."""
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                return None
            texts.append(part["text"])
        return "".join(texts)
    return None


def responses_body(chat: Mapping[str, Any]) -> dict[str, Any] | None:
    """A chat-completions body said as a Responses body (what `/responses/input_tokens` reads):
    messages become input items, tool calls `function_call` items, tool results
    `function_call_output`; None when it holds what has no such counterpart here."""
    items: list[dict[str, Any]] = []
    for message in chat.get("messages") or ():
        if not isinstance(message, Mapping):
            return None
        role = message.get("role")
        if role == "tool":
            output = _text(message.get("content"))
            if output is None:
                return None
            items.append({"type": "function_call_output", "call_id": message.get("tool_call_id"), "output": output})
            continue
        content = message.get("content")
        if isinstance(content, list):
            kind = "output_text" if role == "assistant" else "input_text"
            parts: list[dict[str, Any]] = []
            for part in content:
                if isinstance(part, Mapping) and part.get("type") == "text":
                    parts.append({"type": kind, "text": part.get("text")})
                elif isinstance(part, Mapping) and part.get("type") == "image_url" and role != "assistant":
                    image = part.get("image_url")
                    url, detail = (
                        (image.get("url"), image.get("detail", "auto"))
                        if isinstance(image, Mapping)
                        else (image, "auto")
                    )
                    parts.append({"type": "input_image", "image_url": url, "detail": detail})
                else:
                    return None
            items.append({"role": role, "content": parts})
        elif isinstance(content, str) and content:
            items.append({"role": role, "content": content})
        for call in message.get("tool_calls") or () if role == "assistant" else ():
            function = call.get("function") if isinstance(call, Mapping) else None
            if not isinstance(function, Mapping):
                return None
            items.append(
                {
                    "type": "function_call",
                    "call_id": call.get("id"),
                    "name": function.get("name"),
                    "arguments": function.get("arguments") or "",
                }
            )
    request: dict[str, Any] = {"input": items}
    tools = [_responses_tool(t) for t in chat.get("tools") or ()]
    if tools:
        if any(t is None for t in tools):
            return None
        request["tools"] = tools
    choice = chat.get("tool_choice")
    if isinstance(choice, str):
        request["tool_choice"] = choice
    elif isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping):
        request["tool_choice"] = {"type": "function", "name": choice["function"].get("name")}
    if "parallel_tool_calls" in chat:
        request["parallel_tool_calls"] = chat["parallel_tool_calls"]
    if isinstance(chat.get("reasoning_effort"), str):
        request["reasoning"] = {"effort": chat["reasoning_effort"]}
    response_format = chat.get("response_format")
    if isinstance(response_format, Mapping) and response_format.get("type") == "json_schema":
        schema = response_format.get("json_schema") or {}
        request["text"] = {"format": {"type": "json_schema", **schema}}
    return request


def _responses_tool(tool: object) -> dict[str, Any] | None:
    function = tool.get("function") if isinstance(tool, Mapping) and tool.get("type") == "function" else None
    if not isinstance(function, Mapping):
        return None
    return {"type": "function", **function}


def vertex_body(chat: Mapping[str, Any]) -> dict[str, Any] | None:
    """A chat-completions body said as Vertex AI's `countTokens` request (`contents`,
    `systemInstruction`, `tools`), as Vertex's own OpenAI-compatible endpoint maps it; None for
    content other than text."""
    contents: list[dict[str, Any]] = []
    system: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool call id -> function name, for the results
    for message in chat.get("messages") or ():
        if not isinstance(message, Mapping):
            return None
        role, text = message.get("role"), _text(message.get("content"))
        if text is None:
            return None
        if role in ("system", "developer"):
            system.append({"text": text})
        elif role == "tool":
            name = names.get(str(message.get("tool_call_id")), "")
            response = {"functionResponse": {"name": name, "response": {"content": text}}}
            contents.append({"role": "user", "parts": [response]})
        else:
            parts: list[dict[str, Any]] = [{"text": text}] if text else []
            for call in message.get("tool_calls") or () if role == "assistant" else ():
                function = call.get("function") if isinstance(call, Mapping) else None
                if not isinstance(function, Mapping):
                    return None
                names[str(call.get("id"))] = str(function.get("name"))
                try:
                    args = json.loads(function.get("arguments") or "{}")
                except ValueError:
                    args = {"arguments": function.get("arguments")}
                parts.append({"functionCall": {"name": function.get("name"), "args": args}})
            contents.append({"role": "model" if role == "assistant" else "user", "parts": parts})
    request: dict[str, Any] = {"contents": contents}
    if system:
        request["systemInstruction"] = {"parts": system}
    declarations = []
    for tool in chat.get("tools") or ():
        function = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(function, Mapping):
            return None
        declarations.append({k: function[k] for k in ("name", "description", "parameters") if k in function})
    if declarations:
        request["tools"] = [{"functionDeclarations": declarations}]
    return request
