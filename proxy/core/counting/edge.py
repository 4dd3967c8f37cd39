"""The provider's own count at the edge of the budget: when to ask it, where, and how to read it.

A count that is not exact is an upper bound. A tokenizer that is a bound may also say how far
above the real count it can be (`Bounded.bound_ratio`: real >= count / ratio), which gives a lower
bound. When the two straddle the budget (the lower fits, the upper does not), the guard cannot
tell whether the request fits: it asks the upstream's count endpoint once, and that count decides.
Away from the edge nothing is asked: a request whose upper bound fits is sent, one whose lower
bound does not fit is cut.

Each upstream kind's provider (`proxy.providers`) builds the call to its own endpoint
(`CountCall`); the bodies it needs said in another shape are here (`responses_body`, `vertex_body`).
vLLM and llama.cpp count through their tokenize endpoints (`proxy.server.backends.tokenize`).

Pure: the shell (`proxy.server.backends.provider_count`) performs the call and caches the answer.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable


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
    """One request to a count endpoint (built by the upstream's provider, `proxy.providers`), the
    field of its answer that holds the count, and the headers the endpoint requires when the
    forwarded request carries none (Anthropic's `anthropic-version`)."""

    url: str
    body: Mapping[str, Any]
    answer_field: str
    headers: Mapping[str, str] = field(default_factory=dict)

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
