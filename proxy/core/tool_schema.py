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
(tests/core/test_tools_api_counts.py pins every case and its source): a function's description
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
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Keywords whose effect on the rendering was measured (see the module docstring).
_MEASURED_KEYWORDS = frozenset(
    {"type", "description", "enum", "properties", "required", "items", "anyOf", "const", "default"}
)
# Keywords that change nothing the model is shown, whatever their value.
_SILENT_KEYWORDS = frozenset({"additionalProperties", "title", "$schema", "$id", "$comment"})
_MAX_DEPTH = 24  # a deeper schema is hostile; its JSON is shown as a comment instead


@dataclass(frozen=True, slots=True)
class Rendering:
    """The text the model is shown, and why (if at all) its count is an estimate."""

    text: str
    estimates: tuple[str, ...] = ()

    @property
    def exact(self) -> bool:
        return not self.estimates


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
    for function in functions:
        rendered = render_function(function, shows_all)
        lines.append(rendered.text)
        estimates += rendered.estimates
    lines.append("} // namespace functions")
    return Rendering("\n".join(lines), tuple(dict.fromkeys(estimates)))


def render_function(function: Mapping[str, Any], shows_all: bool = False) -> Rendering:
    """One function's declaration, with the empty line that follows it in the namespace."""
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
        schema = _Schema(parameters if isinstance(parameters, Mapping) else {}, estimates, shows_all)
        lines.append(f"type {name} = (_: {{")
        lines.append(schema.properties(parameters if isinstance(parameters, Mapping) else {}, 0, 0))
        lines.append("}) => any;")
    else:
        lines.append(f"type {name} = () => any;")
    lines.append("")
    return Rendering("\n".join(lines), tuple(dict.fromkeys(estimates)))


class _Schema:
    """Renders the properties of one function's parameters; `$ref`s resolve against its root."""

    def __init__(self, root: Mapping[str, Any], estimates: list[str], shows_all: bool = False) -> None:
        self.shows_all = shows_all
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
        return "\n".join(" " * indent + line for line in lines)

    def type(self, schema: Mapping[str, Any], indent: int, depth: int) -> str:
        """The type expression of `schema`; keywords without a measured rendering follow it as a
        comment, so that they are counted rather than ignored."""
        if depth > _MAX_DEPTH:
            self.estimates.append("schema nested too deep")
            return "any /* " + _json(schema) + " */"
        unknown = _unknown_keywords(schema, set())
        if not unknown:
            return self._type(schema, indent, depth)
        self.estimates.append("unmeasured schema keywords: " + ", ".join(sorted(unknown)))
        shown = "; ".join(f"{key}: {_json(value)}" for key, value in unknown.items())
        return f"{self._type(schema, indent, depth)} /* {shown} */"

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
            return f"{self.type(items, indent, depth)}[]" if isinstance(items, Mapping) else "any[]"
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
