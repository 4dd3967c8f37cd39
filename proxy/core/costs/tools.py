"""Tokens of a request's tool definitions, its `tool_choice` / `function_call`, and its
`response_format`.

For OpenAI models, function definitions (`tools`, legacy `functions`, and Responses-API function
tools once converted) are rendered once as the `namespace functions` text of
`proxy.core.costs.tool_schema` and counted with the model's tokenizer. The namespace is joined to the
first system message, which gains a trailing newline; without one it becomes its own system
message. In tokens (`ChatFormat`): the text, plus `functions_overhead` (9), plus `system_join`
(-4) and the newline's tokens when a system message exists. These rules reproduce the
API-reported counts pinned in tests/core/costs/test_tools_api_counts.py, from gpt-3.5-turbo-0613 to
gpt-4.1; strict functions (the Responses default) are counted the same way and flagged, since
one measured Responses case costs less than this rendering.

A function whose schema expands past `RENDER_BUDGET` characters (`$ref` chains, type lists) is
not rendered: the namespace is then counted at one token per UTF-8 byte of what was rendered plus
that function's `expansion_bound()`, an upper bound for a byte-level vocabulary.

Forcing costs `forced_call_overhead` (4) plus the function's name as tokenized after the dot of
`functions.NAME` (`ChatFormat.call_name_prefix`, as for a call); `function_call: "none"` costs
`choice_none` (1). Both were measured with legacy `function_call`; the same rules are used for
`tool_choice`, and the count says so.

Families whose chat templates write tools as JSON (`ChatFormat.namespace_tools` False) get an
upper bound instead: each tool's JSON indented by four spaces (the widest form templates use),
plus a preamble bound. Hosted and custom tools have no published rendering: their JSON is counted
and the count is marked as an estimate.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.core.costs.tool_schema import function_definition, render_namespace
from proxy.core.counting.bound import utf8_bytes
from proxy.core.counting.count_cache import CountCache, count_text
from proxy.core.counting.tokenizer import Tokenizer
from proxy.core.models.model_registry import ChatFormat

# Around a JSON-schema response format: no measurement exists; the framing the cookbook measured
# around a function definition (7 + 12), kept so that the bound did not fall when it was replaced.
RESPONSE_FORMAT_FRAMING = 19


@dataclass(frozen=True, slots=True)
class ToolsCount:
    """Tokens of one request-level part, and why (if at all) they are an estimate."""

    tokens: int
    notes: tuple[str, ...] = ()

    @property
    def exact(self) -> bool:
        return not self.notes


NOTHING = ToolsCount(0)  # a part the body does not have
# The fields whose absence makes every tool cost nothing: a plain chat skips the tools' code whole.
TOOL_FIELDS = ("tools", "functions", "tool_choice", "function_call")


def functions_of(body: Mapping[str, Any]) -> tuple[list[Mapping[str, Any]], list[Any]]:
    """Function definitions from `tools` (chat-completions or Responses shape) and legacy
    `functions`, and the other tools (hosted or custom ones) that have no function schema."""
    functions: list[Mapping[str, Any]] = []
    others: list[Any] = []
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else ():
        definition = function_definition(tool)
        if definition is None:
            others.append(tool)
        else:
            functions.append(definition)
    legacy = body.get("functions")
    for function in legacy if isinstance(legacy, list) else ():
        (functions if isinstance(function, Mapping) else others).append(function)
    return functions, others


def tool_definitions_tokens(
    body: Mapping[str, Any], tokenizer: Tokenizer, fmt: ChatFormat, cache: CountCache | None = None
) -> ToolsCount:
    """Tokens of every tool definition in `body` and of its tool choice."""
    functions, others = functions_of(body)
    messages = body.get("messages")
    messages = messages if isinstance(messages, list) else []
    definitions = functions_tokens(functions, messages, tokenizer, fmt, cache)
    total = definitions.tokens
    notes = list(definitions.notes)
    for other in others:
        kind = other.get("type") if isinstance(other, Mapping) else None
        notes.append(f"tool of type {kind!r}: no published rendering; counted as its JSON")
        total += fmt.functions_overhead + count_text(tokenizer, _compact_json(other), cache)
    choice = choice_tokens(body, functions, tokenizer, fmt)
    return ToolsCount(total + choice.tokens, (*notes, *choice.notes))


def functions_tokens(
    functions: Sequence[Mapping[str, Any]],
    messages: Sequence[Any],
    tokenizer: Tokenizer,
    fmt: ChatFormat,
    cache: CountCache | None = None,
) -> ToolsCount:
    """Tokens that `functions` add to a prompt whose messages are `messages` (their first system
    message is where the namespace joins)."""
    if not functions:
        return ToolsCount(0)
    if not fmt.namespace_tools:
        text = "\n".join(json.dumps({"type": "function", "function": f}, indent=4, default=str) for f in functions)
        tokens = fmt.functions_overhead + count_text(tokenizer, text, cache)
        return ToolsCount(tokens, ("tool definitions: this model's template is not published; counted as JSON",))
    rendering = render_namespace(functions, shows_all=not fmt.tools_measured)
    if rendering.unrendered_bytes:  # a function too large to render: the namespace by its bytes
        text_tokens = utf8_bytes(rendering.text) + rendering.unrendered_bytes
    else:
        text_tokens = count_text(tokenizer, rendering.text, cache)
    tokens = fmt.functions_overhead + text_tokens
    system = first_system_text(messages)
    if system is not None:
        # The namespace joins the system message, which gains a newline (that may merge with its
        # last characters, as in "Hello:" + "\n").
        tokens += fmt.system_join + count_text(tokenizer, system + "\n", cache) - count_text(tokenizer, system, cache)
    notes = [f"tool definitions: {reason}" for reason in rendering.estimates]
    if not fmt.tools_measured:
        notes.append("tool definitions: this model's tool frame is not published; bounded by the largest gap measured")
    return ToolsCount(tokens, tuple(notes))


def choice_tokens(
    body: Mapping[str, Any], functions: Sequence[Mapping[str, Any]], tokenizer: Tokenizer, fmt: ChatFormat
) -> ToolsCount:
    """Tokens of `tool_choice`, or of legacy `function_call` when there is no `tool_choice`."""
    legacy = "tool_choice" not in body
    choice = body.get("function_call") if legacy else body.get("tool_choice")
    if choice is None or choice == "auto":
        return ToolsCount(0)
    notes = () if legacy else ("tool_choice: measured for function_call only; counted the same way",)
    if choice == "none":
        return ToolsCount(fmt.choice_none, notes)
    if isinstance(choice, Mapping):
        nested = choice.get("function")
        name = choice.get("name") if isinstance(choice.get("name"), str) else None
        if name is None and isinstance(nested, Mapping) and isinstance(nested.get("name"), str):
            name = nested["name"]
        if name is not None:
            return ToolsCount(fmt.forced_call_overhead + tokenizer.count(fmt.call_name_prefix + name), notes)
    # "required", an allowed-tools list or a hosted tool: unpublished. Bounded by forcing the
    # longest-named function, or by the choice's own JSON when it names no function.
    prefix = fmt.call_name_prefix
    longest = max((tokenizer.count(prefix + str(f.get("name", ""))) for f in functions), default=0)
    bound = fmt.forced_call_overhead + max(longest, tokenizer.count(_compact_json(choice)))
    return ToolsCount(bound, (f"tool_choice {_compact_json(choice)[:40]}: no published rendering; bounded",))


def response_format_tokens(body: Mapping[str, Any], tokenizer: Tokenizer, fmt: ChatFormat) -> ToolsCount:
    """A JSON-schema response format is rendered into the prompt in a form that is not
    published; its compact JSON is counted, an upper bound of any TypeScript-like rendering
    (braces and quotes cost more)."""
    response_format = body.get("response_format")
    if not isinstance(response_format, Mapping):
        return ToolsCount(0)
    if response_format.get("type") == "json_schema":
        schema = _compact_json(response_format.get("json_schema"))
        tokens = RESPONSE_FORMAT_FRAMING + tokenizer.count(schema)
        return ToolsCount(tokens, ("response_format: json_schema rendering not published; counted as its JSON",))
    if response_format.get("type") == "json_object":
        return ToolsCount(fmt.per_message, ("response_format: json_object framing not published; bounded",))
    return ToolsCount(0)


def first_system_text(messages: Sequence[Any]) -> str | None:
    """The text of the first system message, which the function namespace joins; its last text
    part when the content is a list."""
    for message in messages:
        if isinstance(message, Mapping) and message.get("role") == "system":
            content = message.get("content")
            if isinstance(content, str):
                return content
            if isinstance(content, list):
                texts = [p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str)]
                return texts[-1] if texts else ""
            return ""
    return None


def _compact_json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True, default=str)
