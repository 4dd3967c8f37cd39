"""Chat completions: the core's own shape, so the view is the body itself; and the body as the
edge accepts it.

Parsing checks every field the core reads (`proxy.wire.readers`: `messages`, each an object with a
string `role`, tools, tool calls, content parts, token limits; a string `model` when present:
Azure deployments name the model in the path instead). Rendering returns the trimmed body, which
the core already built with every other field kept.

The checks: the core reads plain data defensively, but a value of the wrong shape (`tools: 5`,
`tool_choice: {"function": 5}`, `max_tokens` written as a 23-digit integer) must get a clear
OpenAI-shaped 400 naming the field, never a 500, and never be counted one way while the upstream
reads another. Fields the core does not read are not looked at, and are forwarded untouched.
`check_chat_body(value)` is the one check, run by the adapter's `parse` (so by the server's chat
path and the CLI's `count` / `trim` alike) on a body already read strictly
(`proxy.wire.readers.read_chat_body` reads and checks in one call). It raises `InvalidBody`,
whose message is one line and whose `param` names the field.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from proxy.apis import fields
from proxy.apis.base import Adapter, InvalidRequest, Origin, Parsed, Source, optional_model, stream_flag
from proxy.apis.endpoints import Endpoint, Shape, ShapeOptions
from proxy.apis.fields import NOTHING_KNOWN, KnownPrefix, unread_fields
from proxy.core.plan import InvalidBody, validate_body
from proxy.core.trimming.budget import Removal
from proxy.core.work_budget import BLOCK_UNITS, spend

# Every chat request of n messages has the same n sources: built once for the first few thousand
# indices (a few hundred KB at most) and sliced per request. Grown by rebinding, never in place,
# so a parse on another thread (a large body) always sees a consistent tuple.
_SOURCES_KEPT = 4096
_sources: tuple[Source, ...] = ()


def message_sources(count: int) -> tuple[Source, ...]:
    """`messages[i]` is where view message i came from, for i < count."""
    global _sources
    kept, sources = min(count, _SOURCES_KEPT), _sources
    if len(sources) < kept:
        sources = _sources = sources + tuple(Source((Origin("messages", i),)) for i in range(len(sources), kept))
    head = sources[:kept]
    return head if kept == count else head + tuple(Source((Origin("messages", i),)) for i in range(kept, count))


class ChatAdapter(Adapter):
    name: ClassVar[str] = "chat"
    body_is_view: ClassVar[bool] = True
    writes_inserted: ClassVar[bool] = True
    resent_array: ClassVar[str | None] = "messages"
    accounted: ClassVar[frozenset[str]] = fields.CHAT  # the output reserve's field is the body's: `Parsed` says

    def parse(self, body: object, known: KnownPrefix = NOTHING_KNOWN) -> Parsed:
        try:
            checked = check_chat_body(
                body, require_model=False, checked_messages=known.checked, checked_others=known.others_known
            )
        except InvalidBody as exc:
            raise InvalidRequest(str(exc), param=exc.param) from None
        model = optional_model(checked, required=False)
        messages = checked["messages"]
        hashes = known.hashes if len(known.hashes) == len(messages) else ()
        reserve = "max_completion_tokens" if "max_completion_tokens" in checked else "max_tokens"
        return Parsed(
            api=self.name,
            body=checked,
            chat=checked,
            sources=message_sources(len(messages)),
            model=model,
            stream=stream_flag(checked),
            reserve_field=reserve,
            reserve_view_field=reserve,
            message_hashes=hashes,
            shared_messages=known.checked if hashes else 0,
            unread=unread_fields(checked, self.accounted),
            same_as=weakref.ref(known.same) if hashes and known.same is not None else None,
        )

    def render(
        self, parsed: Parsed, trimmed: Mapping[str, Any], removals: Sequence[Removal], inserted: Sequence[int] = ()
    ) -> dict[str, Any]:
        """The core trimmed the body itself, every other field kept, and may have added messages
        (the budget note): the trimmed body is the answer."""
        return dict(trimmed)


CHAT_PATHS = ("/v1/chat/completions", "/chat/completions", "/openai/v1/chat/completions")
_AZURE_CHAT = re.compile(r"/openai/deployments/(?P<deployment>[^/]+)/chat/completions")


def shape(options: ShapeOptions) -> Shape:
    """Chat Completions, at OpenAI's paths and an Azure deployment's (its model: the deployment)."""
    adapter = ChatAdapter()
    endpoint = Endpoint(adapter)

    def deployment(path: str) -> Endpoint | None:
        found = _AZURE_CHAT.fullmatch(path)
        return Endpoint(adapter, path_model=found["deployment"]) if found else None

    return Shape(adapter.name, (adapter,), dict.fromkeys(CHAT_PATHS, endpoint), deployment, _generates)


def _generates(segments: tuple[str, ...]) -> bool:
    return segments[-2:] == ("chat", "completions")


# What a chat-completions body's fields must be, checked once at the edge.
MAX_OUTPUT_TOKENS = 2**31 - 1  # above any model's output limit; larger is a client bug, not a budget
Check = Callable[[Any, str], None]


def check_chat_body(
    value: object, *, require_model: bool = True, checked_messages: int = 0, checked_others: bool = False
) -> dict[str, Any]:
    """`value` as a chat-completions body, or InvalidBody naming the first field of the wrong type.
    The first `checked_messages` messages passed this check before (the same values, read from
    the same bytes of an earlier body: `proxy.wire.prefix_reader`) and are not looked at again; with
    `checked_others`, neither are the fields other than `messages`."""
    if not isinstance(value, dict):
        raise InvalidBody(f"the request body must be a JSON object, not {_kind(value)}")
    validate_body(value, checked_messages)  # the core's own minimum: a non-empty `messages` of objects with roles
    model = value.get("model")
    if (require_model or model is not None) and (not isinstance(model, str) or not model):
        raise InvalidBody("'model' is required and must be a non-empty string", param="model")
    messages = value["messages"]
    for i in range(checked_messages, len(messages)):
        if not _plain_text(messages[i]):
            _message(messages[i], f"messages[{i}]")
    if checked_others:
        return value
    _optional(value, "tools", _array_of(_tool))
    _optional(value, "functions", _array_of(_FUNCTION))
    _optional(value, "tool_choice", _CHOICE)
    _optional(value, "function_call", _CHOICE)
    _optional(value, "response_format", _RESPONSE_FORMAT)
    for key in ("max_tokens", "max_completion_tokens"):
        _optional(value, key, _token_limit)
    return value


_TEXT_OR_NULL = (str, type(None))


def _plain_text(message: object) -> bool:
    """A message `_message` would pass, told with no call per field: every field it checks a
    string or null, the role a string, tool calls (if any) of strings, no legacy function call
    (most messages of most requests). Anything else takes the full check, which names the field."""
    if type(message) is not dict:
        return False
    get = message.get
    calls = get("tool_calls")
    return (
        type(get("role")) is str
        and type(get("content")) in _TEXT_OR_NULL
        and type(get("name")) in _TEXT_OR_NULL
        and type(get("tool_call_id")) in _TEXT_OR_NULL
        and type(get("refusal")) in _TEXT_OR_NULL
        and get("function_call") is None
        and (calls is None or (type(calls) is list and all(map(_plain_call, calls))))
    )


def _plain_call(call: object) -> bool:
    if type(call) is not dict:
        return False
    function = call.get("function")
    return (
        type(call.get("id")) in _TEXT_OR_NULL
        and type(call.get("type")) in _TEXT_OR_NULL
        and (
            function is None
            or (
                type(function) is dict
                and type(function.get("name")) in _TEXT_OR_NULL
                and type(function.get("arguments")) in _TEXT_OR_NULL
            )
        )
    )


def _message(message: object, where: str) -> None:
    if not isinstance(message, dict):
        raise InvalidBody(f"{where} must be an object, not {_kind(message)}", param=where)
    if not isinstance(message.get("role"), str):
        raise InvalidBody(f"{where}.role is required and must be a string", param=f"{where}.role")
    _optional(message, "content", _content, where)
    _optional(message, "name", _string, where)
    _optional(message, "tool_call_id", _string, where)
    _optional(message, "refusal", _string, where)
    _optional(message, "tool_calls", _array_of(_TOOL_CALL), where)
    _optional(message, "function_call", _FUNCTION_CALL, where)


def _content(content: object, where: str) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise InvalidBody(f"{where} must be a string, an array of parts or null, not {_kind(content)}", param=where)
    spend(BLOCK_UNITS * len(content))
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
            _required(part, "image_url", _IMAGE_URL, at)
        elif kind in ("input_audio", "file"):
            _required(part, kind, _object, at)


def _shape(required: Mapping[str, Check] | None = None, optional: Mapping[str, Check] | None = None) -> Check:
    """A check for an object whose `required` and `optional` fields each have their own check."""

    def check(value: object, where: str) -> None:
        _object(value, where)
        assert isinstance(value, dict)
        for key, field_check in (required or {}).items():
            _required(value, key, field_check, where)
        for key, field_check in (optional or {}).items():
            _optional(value, key, field_check, where)

    return check


def _string_or(shape: Check) -> Check:
    def check(value: object, where: str) -> None:
        if not isinstance(value, str):
            shape(value, where)

    return check


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


_FUNCTION_CALL = _shape(optional={"name": _string, "arguments": _string})
_TOOL_CALL = _shape(optional={"id": _string, "type": _string, "function": _FUNCTION_CALL})
_FUNCTION = _shape(required={"name": _string}, optional={"description": _string, "parameters": _object})
_TOOL_OF_TYPE_FUNCTION = _shape(optional={"type": _string}, required={"function": _FUNCTION})
# `"auto"`-style strings, or `{"type": "function", "function": {"name": ...}}` (or legacy `{"name": ...}`).
_CHOICE = _string_or(
    _shape(optional={"type": _string, "name": _string, "function": _shape(optional={"name": _string})})
)
_IMAGE_URL = _string_or(_shape(required={"url": _string}, optional={"detail": _string}))
_RESPONSE_FORMAT = _shape(optional={"type": _string, "json_schema": _object})


def _tool(tool: object, where: str) -> None:
    """A tool: `function` is required of function tools (the default type); other types pass."""
    if isinstance(tool, dict) and tool.get("type", "function") != "function":
        _optional(tool, "type", _string, where)
        return
    _TOOL_OF_TYPE_FUNCTION(tool, where)
