"""A chat-completions body as the edge accepts it: strict JSON, and every field the core reads of
the type it expects.

The core reads plain data defensively, but a value of the wrong shape (`tools: 5`,
`tool_choice: {"function": 5}`, `max_tokens` written as a 23-digit integer) must get a clear
OpenAI-shaped 400 naming the field, never a 500, and never be counted one way while the upstream
reads another. Fields the core does not read are not looked at, and are forwarded untouched.

`read_chat_body(raw)` is the one function the server (and the CLI's `count` / `trim`) call:
it raises `InvalidBody`, whose message is one line and whose `param` names the field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from proxy.core.plan import InvalidBody, validate_body
from proxy.strict_json import DEFAULT_LIMITS, AmbiguousJson, JsonLimits, loads_strict

MAX_OUTPUT_TOKENS = 2**31 - 1  # above any model's output limit; larger is a client bug, not a budget
Check = Callable[[Any, str], None]


def read_chat_body(raw: bytes, limits: JsonLimits = DEFAULT_LIMITS, *, require_model: bool = True) -> dict[str, Any]:
    """The body of a chat-completions request, checked; InvalidBody saying what is wrong."""
    try:
        value = loads_strict(raw, limits)
    except AmbiguousJson as exc:
        raise InvalidBody(f"the request body is ambiguous: {exc}", param=exc.key) from None
    except ValueError as exc:
        raise InvalidBody(f"the request body is not valid JSON: {exc}") from None
    return check_chat_body(value, require_model=require_model)


def check_chat_body(value: object, *, require_model: bool = True) -> dict[str, Any]:
    """`value` as a chat-completions body, or InvalidBody naming the first field of the wrong type."""
    if not isinstance(value, dict):
        raise InvalidBody(f"the request body must be a JSON object, not {_kind(value)}")
    validate_body(value)  # the core's own minimum: a non-empty `messages` of objects with roles
    model = value.get("model")
    if (require_model or model is not None) and (not isinstance(model, str) or not model):
        raise InvalidBody("'model' is required and must be a non-empty string", param="model")
    for i, message in enumerate(value["messages"]):
        _message(message, f"messages[{i}]")
    _optional(value, "tools", _array_of(_tool))
    _optional(value, "functions", _array_of(_function))
    _optional(value, "tool_choice", _choice)
    _optional(value, "function_call", _choice)
    _optional(value, "response_format", _response_format)
    for key in ("max_tokens", "max_completion_tokens"):
        _optional(value, key, _token_limit)
    return value


def _message(message: object, where: str) -> None:
    if not isinstance(message, dict):
        raise InvalidBody(f"{where} must be an object, not {_kind(message)}", param=where)
    if not isinstance(message.get("role"), str):
        raise InvalidBody(f"{where}.role is required and must be a string", param=f"{where}.role")
    _optional(message, "content", _content, where)
    _optional(message, "name", _string, where)
    _optional(message, "tool_call_id", _string, where)
    _optional(message, "refusal", _string, where)
    _optional(message, "tool_calls", _array_of(_tool_call), where)
    _optional(message, "function_call", _function_call, where)


def _content(content: object, where: str) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise InvalidBody(f"{where} must be a string, an array of parts or null, not {_kind(content)}", param=where)
    for j, part in enumerate(content):
        at = f"{where}[{j}]"
        if not isinstance(part, dict):
            raise InvalidBody(f"{at} must be an object, not {_kind(part)}", param=at)
        _optional(part, "type", _string, at)
        kind = part.get("type")
        if kind == "text":
            _required(part, "text", _string, at)
        elif kind == "refusal":
            _required(part, "refusal", _string, at)
        elif kind == "image_url":
            _required(part, "image_url", _image_url, at)
        elif kind in ("input_audio", "file"):
            _required(part, kind, _object, at)


def _image_url(spec: object, where: str) -> None:
    if isinstance(spec, str):
        return
    _object(spec, where)
    assert isinstance(spec, dict)
    _required(spec, "url", _string, where)
    _optional(spec, "detail", _string, where)


def _tool_call(call: object, where: str) -> None:
    _object(call, where)
    assert isinstance(call, dict)
    _optional(call, "id", _string, where)
    _optional(call, "type", _string, where)
    _optional(call, "function", _function_call, where)


def _function_call(function: object, where: str) -> None:
    _object(function, where)
    assert isinstance(function, dict)
    _optional(function, "name", _string, where)
    _optional(function, "arguments", _string, where)


def _tool(tool: object, where: str) -> None:
    _object(tool, where)
    assert isinstance(tool, dict)
    _optional(tool, "type", _string, where)
    if tool.get("type", "function") == "function":
        _required(tool, "function", _function, where)


def _function(function: object, where: str) -> None:
    _object(function, where)
    assert isinstance(function, dict)
    _required(function, "name", _string, where)
    _optional(function, "description", _string, where)
    _optional(function, "parameters", _object, where)


def _choice(choice: object, where: str) -> None:
    """`"auto"`-style strings, or `{"type": "function", "function": {"name": ...}}` (or legacy `{"name": ...}`)."""
    if isinstance(choice, str):
        return
    _object(choice, where)
    assert isinstance(choice, dict)
    _optional(choice, "type", _string, where)
    _optional(choice, "name", _string, where)
    _optional(choice, "function", _named, where)


def _named(value: object, where: str) -> None:
    _object(value, where)
    assert isinstance(value, dict)
    _optional(value, "name", _string, where)


def _response_format(value: object, where: str) -> None:
    _object(value, where)
    assert isinstance(value, dict)
    _optional(value, "type", _string, where)
    _optional(value, "json_schema", _object, where)


def _token_limit(value: object, where: str) -> None:
    if type(value) is not int or not 0 <= value <= MAX_OUTPUT_TOKENS:
        message = f"{where} must be a whole number from 0 to {MAX_OUTPUT_TOKENS}, not {_short(value)}"
        raise InvalidBody(message, param=where)


def _string(value: object, where: str) -> None:
    if not isinstance(value, str):
        raise InvalidBody(f"{where} must be a string, not {_kind(value)}", param=where)


def _object(value: object, where: str) -> None:
    if not isinstance(value, dict):
        raise InvalidBody(f"{where} must be an object, not {_kind(value)}", param=where)


def _array_of(item: Check) -> Check:
    def check(value: object, where: str) -> None:
        if not isinstance(value, list):
            raise InvalidBody(f"{where} must be an array, not {_kind(value)}", param=where)
        for i, element in enumerate(value):
            item(element, f"{where}[{i}]")

    return check


def _optional(container: Mapping[str, Any], key: str, check: Check, where: str = "") -> None:
    """Check `container[key]` unless it is absent or null (null means "not set" to OpenAI)."""
    value = container.get(key)
    if value is not None:
        check(value, f"{where}.{key}" if where else key)


def _required(container: Mapping[str, Any], key: str, check: Check, where: str) -> None:
    if container.get(key) is None:
        raise InvalidBody(f"{where}.{key} is required", param=f"{where}.{key}")
    check(container[key], f"{where}.{key}")


def _kind(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean", int: "a number"}
    return "null" if value is None else names.get(type(value), "a number")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 24 else text[:21] + "..."
