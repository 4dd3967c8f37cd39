"""Function definitions as OpenAI shows them to the model: the `namespace functions` text.

OpenAI does not put the JSON schemas of `tools` / `functions` into the prompt. It rewrites them
into TypeScript-like declarations, one namespace for all functions:

    namespace functions {

    // Get the current weather
    type get_current_weather = (_: {
    // The city and state
    location: string,
    unit?: "celsius" | "fahrenheit", // default: "celsius"
    }) => any;

    } // namespace functions

The rules below are the ones whose token counts were checked against `usage.prompt_tokens`
(tests/core/costs/test_tools_api_counts.py pins every case and its source): a function's description
as a comment; `?` for a property not in `required`; string enums quoted and joined with ` | `;
numbers and integers as `number`; arrays as `T[]`; nested objects in braces, their lines indented
by two spaces per level, the closing brace not; `anyOf` joined with ` | `; `const`,
`additionalProperties` and the description of `parameters` itself not shown; property
descriptions shown for top-level properties only; a default as a trailing comment.

Reasoning models (gpt-5, the o-series, gpt-oss) are shown their tools by the harmony renderer,
whose rules were not measured here; openai/harmony's own `json_schema_to_typescript` shows the
title, the description and the examples of every property at every depth, and each object's own
description. For them (`shows_all`) every one of those is rendered too, so that the count is not
below what they are shown.

Anything else (`$ref`, `oneOf`/`allOf`, a list of types, formats, bounds, multi-line
descriptions, `strict`) has no published or measured rendering. It is rendered here in a form
that costs at least what the API is likely to show (unknown keywords become comments), and the
rendering says it is an estimate, so the count is reported as not exact.

`$ref`s are written out in place and a list of types renders the schema once per type, so a
small schema can expand exponentially (a chain of `$defs` each referring to the next K times
grows as K to the power of its depth). Rendering is therefore metered: every string the renderer
builds is charged to a budget of `RENDER_BUDGET` characters. A function that exhausts it is not
rendered; it is counted by `expansion_bound()`, an upper bound of its rendering's UTF-8 bytes
(at most one token each) computed from the schema's shape without expanding it, and the
rendering says so.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from proxy.core.work_budget import spend

# Keywords whose effect on the rendering was measured (see the module docstring).
_MEASURED_KEYWORDS = frozenset(
    {"type", "description", "enum", "properties", "required", "items", "anyOf", "const", "default"}
)
# Keywords that change nothing the model is shown, whatever their value.
_SILENT_KEYWORDS = frozenset({"additionalProperties", "title", "$schema", "$id", "$comment"})
_MAX_DEPTH = 24  # a deeper schema is hostile; its JSON is shown as a comment instead
# Characters the renderer may build for one namespace (each string it makes, counted as built:
# a nested object's text is counted again in its parent's). Past it, a function is bounded.
RENDER_BUDGET = 4 * 1024 * 1024
# One function may build at most this many characters per byte of its JSON, plus a constant, within
# the namespace's budget: a small schema that expands a thousandfold stops early (it is planned on
# the event loop when its body is small), while an honest one (a few `$ref`s written out in place)
# stays far below it.
FUNCTION_BUDGET_PER_BYTE = 256
FUNCTION_BUDGET_BASE = 64 * 1024
# What one schema visited adds to a rendering besides its children's text, at most, in bytes per
# byte of the function's JSON (a description line costs its text, `// ` and the indentation of
# up to `_MAX_DEPTH` levels of four spaces: about 54 bytes for a `\\n` of 2) and a constant.
_BYTES_PER_JSON_BYTE = 64
_BYTES_PER_VISIT = 512
# The largest bound reported: past every model's window, so the decision it leads to (the
# request does not fit) is the one the true figure would give, and it stays a 64-bit integer.
BOUND_CAP = 1 << 40


@dataclass(frozen=True, slots=True)
class Rendering:
    """The text the model is shown, and why (if at all) its count is an estimate."""

    text: str
    estimates: tuple[str, ...] = ()
    # UTF-8 bytes (an upper bound of tokens) of functions too large to render, not in `text`.
    unrendered_bytes: int = 0

    @property
    def exact(self) -> bool:
        return not self.estimates


class _TooLarge(Exception):
    """The rendering ran past its budget."""


class _Meter:
    """Characters built so far by one namespace's rendering, against `RENDER_BUDGET`."""

    def __init__(self, budget: int | None = None) -> None:
        self.left = RENDER_BUDGET if budget is None else budget

    def charge(self, text: str) -> str:
        spend(len(text) + 1)  # and from the caller's budget, when one is bound (proxy.core.work_budget)
        self.left -= len(text) + 1  # each call at least one unit: an empty result is work too
        if self.left < 0:
            raise _TooLarge
        return text


def _json_size(value: object) -> int:
    """The length of `value` as compact JSON (what the function's own size is measured by)."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False, default=str))


def function_definition(tool: object) -> Mapping[str, Any] | None:
    """The function definition (`name`, `description`, `parameters`) of a chat-completions tool
    (`{"type": "function", "function": {...}}`), a Responses-API function tool (`{"type":
    "function", "name": ..., "parameters": ...}`) or a legacy `functions` entry; None for any
    other tool (hosted tools, custom tools), which has no function schema."""
    if not isinstance(tool, Mapping):
        return None
    kind = tool.get("type", "function")
    if kind != "function":
        return None
    nested = tool.get("function")
    if isinstance(nested, Mapping):
        return nested
    if isinstance(tool.get("name"), str):
        return tool
    return None


def render_namespace(functions: Iterable[Mapping[str, Any]], shows_all: bool = False) -> Rendering:
    """Every function in one `namespace functions { ... }` block, as the model sees it (with
    `shows_all`, as a reasoning model may: every title, description and example)."""
    lines = ["namespace functions {", ""]
    estimates: list[str] = []
    meter, unrendered = _Meter(), 0
    for function in functions:
        rendered = render_function(function, shows_all, meter)
        lines.append(rendered.text)
        estimates += rendered.estimates
        unrendered += rendered.unrendered_bytes
    lines.append("} // namespace functions")
    return Rendering("\n".join(lines), tuple(dict.fromkeys(estimates)), min(unrendered, BOUND_CAP))


def render_function(function: Mapping[str, Any], shows_all: bool = False, meter: _Meter | None = None) -> Rendering:
    """One function's declaration, with the empty line that follows it in the namespace; a
    function whose rendering runs past the budget is bounded instead (`unrendered_bytes`)."""
    meter = meter or _Meter()
    own = _Meter(min(meter.left, FUNCTION_BUDGET_BASE + FUNCTION_BUDGET_PER_BYTE * _json_size(function)))
    start = own.left
    try:
        rendered = _render_function(function, shows_all, own)
        meter.left -= start - own.left
        return rendered
    except _TooLarge:
        meter.left -= start
        bound = expansion_bound(function)
        note = f"schema expands past {start} characters ($ref or type lists): bounded at {bound} bytes"
        return Rendering("", (note,), bound)


def _render_function(function: Mapping[str, Any], shows_all: bool, meter: _Meter) -> Rendering:
    estimates: list[str] = []
    name = _text(function.get("name"))
    lines = _comment(_text(function.get("description")), estimates)
    parameters = function.get("parameters")
    if isinstance(parameters, Mapping) and shows_all:
        lines += _shown_all(parameters, estimates)
    if isinstance(parameters, Mapping):
        unknown = _unknown_keywords(parameters, {"description"})
        if unknown:
            estimates.append("unmeasured schema keywords: " + ", ".join(sorted(unknown)))
            lines.append("/* " + _json(unknown) + " */")
        for composite in ("anyOf", "oneOf", "allOf"):
            if composite in parameters:
                estimates.append(f"parameters use top-level {composite}")
                lines.append("/* " + _json(parameters[composite]) + " */")
    if function.get("strict"):
        estimates.append("strict functions have no measured rendering")
    properties = _properties(parameters)
    if properties:
        schema = _Schema(parameters if isinstance(parameters, Mapping) else {}, estimates, shows_all, meter)
        lines.append(f"type {name} = (_: {{")
        lines.append(schema.properties(parameters if isinstance(parameters, Mapping) else {}, 0, 0))
        lines.append("}) => any;")
    else:
        lines.append(f"type {name} = () => any;")
    lines.append("")
    return Rendering("\n".join(lines), tuple(dict.fromkeys(estimates)))


class _Schema:
    """Renders the properties of one function's parameters; `$ref`s resolve against its root."""

    def __init__(
        self, root: Mapping[str, Any], estimates: list[str], shows_all: bool = False, meter: _Meter | None = None
    ) -> None:
        self.shows_all = shows_all
        self.meter = meter or _Meter()
        self.definitions: dict[str, Any] = {}
        for key in ("$defs", "definitions"):
            if isinstance(root.get(key), Mapping):
                self.definitions.update(root[key])
        self.estimates = estimates

    def properties(self, schema: Mapping[str, Any], indent: int, depth: int) -> str:
        required = schema.get("required")
        required = required if isinstance(required, list) else []
        lines: list[str] = []
        for key, prop in _properties(schema).items():
            prop = prop if isinstance(prop, Mapping) else {}
            description = _text(prop.get("description"))
            if self.shows_all:
                lines += _shown_all(prop, self.estimates)
            elif description and indent < 2:  # nested descriptions are not shown
                lines += _comment(description, self.estimates)
            optional = "" if key in required else "?"
            line = f"{key}{optional}: {self.type(prop, indent, depth + 1)},"
            if "default" in prop:
                line += f" // default: {_json(prop['default'])}"
            lines.append(line)
        return self.meter.charge("\n".join(" " * indent + line for line in lines))

    def type(self, schema: Mapping[str, Any], indent: int, depth: int) -> str:
        """The type expression of `schema`; keywords without a measured rendering follow it as a
        comment, so that they are counted rather than ignored."""
        if depth > _MAX_DEPTH:
            self.estimates.append("schema nested too deep")
            return self.meter.charge("any /* " + _json(schema) + " */")
        unknown = _unknown_keywords(schema, set())
        if not unknown:
            return self.meter.charge(self._type(schema, indent, depth))
        self.estimates.append("unmeasured schema keywords: " + ", ".join(sorted(unknown)))
        shown = "; ".join(f"{key}: {_json(value)}" for key, value in unknown.items())
        return self.meter.charge(f"{self._type(schema, indent, depth)} /* {shown} */")

    def _type(self, schema: Mapping[str, Any], indent: int, depth: int) -> str:
        if "$ref" in schema:
            return self._ref(schema, indent, depth)
        if isinstance(schema.get("anyOf"), list):
            return " | ".join(self.type(_mapping(s), indent, depth + 1) for s in schema["anyOf"])
        for composite in ("oneOf", "allOf"):
            if isinstance(schema.get(composite), list):
                self.estimates.append(f"{composite} has no measured rendering")
                joiner = " & " if composite == "allOf" else " | "
                return joiner.join(self.type(_mapping(s), indent, depth + 1) for s in schema[composite])
        kind = schema.get("type")
        if isinstance(kind, list):
            self.estimates.append("a list of types has no measured rendering")
            return " | ".join(self.type({**schema, "type": k}, indent, depth + 1) for k in kind)
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            if kind == "string":
                return " | ".join(f'"{value}"' for value in enum)
            if kind in ("number", "integer"):
                return " | ".join(_json(value) for value in enum)
            self.estimates.append("an enum without a string or number type has no measured rendering")
            return " | ".join(_json(value) for value in enum)
        if kind == "string":
            return "string"
        if kind in ("number", "integer"):
            return "number"
        if kind in ("boolean", "null"):
            return str(kind)
        if kind == "object" or (kind is None and "properties" in schema):
            if not self.shows_all:
                return "\n".join(["{", self.properties(schema, indent + 2, depth), "}"])
            # harmony: the object's own description above its brace, its lines four spaces in
            own = [" " * indent + line for line in _comment(_text(schema.get("description")), self.estimates)]
            return "\n".join([*own, "{", self.properties(schema, indent + 4, depth), "}"])
        if kind == "array":
            items = schema.get("items")
            return f"{self.type(items, indent, depth + 1)}[]" if isinstance(items, Mapping) else "any[]"
        self.estimates.append(f"a schema of type {kind!r} has no measured rendering")
        return "any"

    def _ref(self, schema: Mapping[str, Any], indent: int, depth: int) -> str:
        """A `$ref` to the root's `$defs`, written out in place: at least as long as any
        rendering that names the definition once and declares it elsewhere."""
        self.estimates.append("$ref has no measured rendering")
        target = str(schema["$ref"])
        name = target.rsplit("/", 1)[-1]
        definition = self.definitions.get(name) if target.startswith("#/") else None
        if not isinstance(definition, Mapping):
            return f"any /* {_json(target)} */"
        return self.type(definition, indent, depth + 1)


def expansion_bound(function: Mapping[str, Any]) -> int:
    """An upper bound of the UTF-8 bytes of `function`'s rendering, whatever its `$ref`s and type
    lists expand to, computed without expanding them: the schemas the renderer would visit (each
    `$ref` and each type of a list counted as a visit of its own, memoised by schema and depth),
    times what one visit may add (`_BYTES_PER_JSON_BYTE` per byte of the function's JSON, plus
    `_BYTES_PER_VISIT`), plus the function's own lines. Capped at `BOUND_CAP`."""
    size = len(_json(function).encode("utf-8", "surrogatepass"))
    parameters = function.get("parameters")
    root = parameters if isinstance(parameters, Mapping) else {}
    definitions: dict[str, Any] = {}
    for key in ("$defs", "definitions"):
        if isinstance(root.get(key), Mapping):
            definitions.update(root[key])
    visits = 1 + sum(_visits(_mapping(p), 1, definitions, {}) for p in _properties(root).values())
    per_visit = _BYTES_PER_JSON_BYTE * size + _BYTES_PER_VISIT
    return min(BOUND_CAP, visits * per_visit + per_visit)


def _visits(
    schema: Mapping[str, Any], depth: int, definitions: Mapping[str, Any], memo: dict[tuple[int, int], int]
) -> int:
    """How many times `_Schema.type` runs for `schema` at `depth`, at most (every child the
    renderer may descend into, whichever branch it takes)."""
    if depth > _MAX_DEPTH:
        return 1
    key = (id(schema), depth)
    known = memo.get(key)
    if known is not None:
        return known
    memo[key] = BOUND_CAP  # a cycle cannot occur (depth grows), but never loop on one
    children = 0
    target = schema.get("$ref")
    if target is not None:
        name = str(target).rsplit("/", 1)[-1]
        definition = definitions.get(name) if str(target).startswith("#/") else None
        if isinstance(definition, Mapping):
            children += _visits(definition, depth + 1, definitions, memo)
    for composite in ("anyOf", "oneOf", "allOf"):
        entries = schema.get(composite)
        if isinstance(entries, list):
            children += sum(_visits(_mapping(e), depth + 1, definitions, memo) for e in entries)
    own = sum(_visits(_mapping(p), depth + 1, definitions, memo) for p in _properties(schema).values())
    items = schema.get("items")
    own += _visits(items, depth + 1, definitions, memo) if isinstance(items, Mapping) else 0
    kinds = schema.get("type")
    if isinstance(kinds, list):  # each type renders the schema again, one level deeper
        single = 1 + own + children if depth + 1 <= _MAX_DEPTH else 1
        children += len(kinds) * single
    total = min(BOUND_CAP, 1 + children + own)
    memo[key] = total
    return total


def _shown_all(schema: Mapping[str, Any], estimates: list[str]) -> list[str]:
    """The comments a reasoning model may be shown above a property (or a function's
    parameters): its title, its description and its examples."""
    lines: list[str] = []
    title = _text(schema.get("title"))
    if title:
        lines += [*_comment(title, estimates), "//"]
    lines += _comment(_text(schema.get("description")), estimates)
    examples = schema.get("examples")
    if examples is not None:
        lines.append(f"// Examples: {_json(examples)}")
    return lines


def _unknown_keywords(schema: Mapping[str, Any], allowed: set[str]) -> dict[str, Any]:
    """Keywords that are neither measured, nor silent, nor handled structurally below."""
    handled = _MEASURED_KEYWORDS | _SILENT_KEYWORDS | allowed | {"$ref", "$defs", "definitions", "oneOf", "allOf"}
    return {key: value for key, value in schema.items() if key not in handled}


def _comment(text: str, estimates: list[str]) -> list[str]:
    if not text:
        return []
    if "\n" not in text:
        return [f"// {text}"]
    # Unmeasured: every line as its own comment costs at least the one-comment form.
    estimates.append("multi-line descriptions have no measured rendering")
    return [f"// {line}" for line in text.split("\n")]


def _properties(schema: object) -> Mapping[str, Any]:
    if isinstance(schema, Mapping) and isinstance(schema.get("properties"), Mapping):
        return schema["properties"]  # type: ignore[no-any-return]  # a JSON object
    return {}


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)
