"""Tokens of tool definitions, `tool_choice` and `response_format`.

OpenAI renders function definitions into the prompt as a TypeScript-like namespace:

    namespace functions {
    // Get the current weather
    type get_current_weather = (_: {
    // The city and state
    location: string,
    unit?: "celsius" | "fahrenheit",
    }) => any;
    } // namespace functions

The OpenAI cookbook gives per-function constants that reproduce the API's counts for flat
schemas (string/number properties, enums). Schemas with nested objects, arrays, unions or
`$ref`s are outside what those constants were measured on, so for every function we also
render the namespace text and count it, and take the larger of the two: the count is exact
where the cookbook is, and never below the rendered text where it is not.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from proxy.core.models import ChatFormat
from proxy.core.tokenizer import CountCache, Tokenizer, count_text

_FLAT_TYPES = frozenset({"string", "number", "integer", "boolean"})


def functions_of(body: Mapping[str, Any]) -> tuple[list[Mapping[str, Any]], list[Any]]:
    """Function definitions from `tools` (type function) and legacy `functions`, and the other
    tools (hosted or custom ones) that have no function schema."""
    functions: list[Mapping[str, Any]] = []
    others: list[Any] = []
    for tool in body.get("tools") or ():
        if (
            isinstance(tool, Mapping)
            and tool.get("type", "function") == "function"
            and isinstance(tool.get("function"), Mapping)
        ):
            functions.append(tool["function"])
        else:
            others.append(tool)
    for function in body.get("functions") or ():
        (functions if isinstance(function, Mapping) else others).append(function)
    return functions, others


def tool_definitions_tokens(
    body: Mapping[str, Any], tokenizer: Tokenizer, fmt: ChatFormat, cache: CountCache | None
) -> int:
    functions, others = functions_of(body)
    total = 0
    if functions:
        total += sum(_function_tokens(f, tokenizer, fmt, cache) for f in functions) + fmt.func_end
    for other in others:
        # Hosted and custom tools have no published rendering: their JSON is an upper bound.
        total += fmt.func_init + count_text(tokenizer, _compact_json(other), cache)
    choice = body.get("tool_choice", body.get("function_call"))
    if isinstance(choice, Mapping):
        name = choice.get("name") or (choice.get("function") or {}).get("name") or ""
        # A forced function is named once more to the model.
        total += fmt.per_message + count_text(tokenizer, str(name), cache)
    return total


def response_format_tokens(body: Mapping[str, Any], tokenizer: Tokenizer, fmt: ChatFormat) -> int:
    """A JSON-schema response format is rendered into the prompt; its compact JSON is an upper
    bound of that rendering (braces and quotes cost more than the TypeScript form)."""
    response_format = body.get("response_format")
    if not isinstance(response_format, Mapping):
        return 0
    if response_format.get("type") == "json_schema":
        return fmt.func_init + fmt.func_end + tokenizer.count(_compact_json(response_format.get("json_schema")))
    if response_format.get("type") == "json_object":
        return fmt.per_message
    return 0


def _function_tokens(
    function: Mapping[str, Any], tokenizer: Tokenizer, fmt: ChatFormat, cache: CountCache | None
) -> int:
    cookbook = _cookbook_tokens(function, tokenizer, fmt, cache)
    if cookbook is not None and _is_flat(function):
        return cookbook
    rendered = fmt.func_init + count_text(tokenizer, render_function(function), cache)
    return max(rendered, cookbook or 0)


def _cookbook_tokens(
    function: Mapping[str, Any], tokenizer: Tokenizer, fmt: ChatFormat, cache: CountCache | None
) -> int | None:
    """The cookbook's per-function constants; None where the schema is not of the form they cover."""
    name = function.get("name")
    if not isinstance(name, str):
        return None
    description = _text(function.get("description")).removesuffix(".")
    total = fmt.func_init + count_text(tokenizer, f"{name}:{description}", cache)
    properties = _properties(function.get("parameters"))
    if properties:
        total += fmt.prop_init
        for key, prop in properties.items():
            total += fmt.prop_key
            if not isinstance(prop, Mapping):
                continue
            if isinstance(prop.get("enum"), list):
                total += fmt.enum_init
                for item in prop["enum"]:
                    total += fmt.enum_item + tokenizer.count(str(item))
            p_type = prop.get("type", "")
            p_desc = _text(prop.get("description")).removesuffix(".")
            total += tokenizer.count(f"{key}:{p_type if isinstance(p_type, str) else _compact_json(p_type)}:{p_desc}")
    return total


def _is_flat(function: Mapping[str, Any]) -> bool:
    parameters = function.get("parameters")
    if parameters is None:
        return True
    if not isinstance(parameters, Mapping) or set(parameters) - {
        "type",
        "properties",
        "required",
        "additionalProperties",
    }:
        return False
    for prop in _properties(parameters).values():
        if not isinstance(prop, Mapping) or set(prop) - {"type", "description", "enum"}:
            return False
        kind = prop.get("type")  # JSON Schema allows a list of types: not flat
        if not isinstance(kind, str) or kind not in _FLAT_TYPES:
            return False
    return True


def _properties(parameters: object) -> Mapping[str, Any]:
    if isinstance(parameters, Mapping) and isinstance(parameters.get("properties"), Mapping):
        return parameters["properties"]  # type: ignore[no-any-return]  # JSON object
    return {}


def render_function(function: Mapping[str, Any]) -> str:
    """One function as OpenAI's namespace renders it, with nested schemas written out in full."""
    lines: list[str] = []
    description = _text(function.get("description"))
    if description:
        lines += [f"// {line}" for line in description.splitlines()]
    name = _text(function.get("name"))
    parameters = function.get("parameters")
    if _properties(parameters) or (isinstance(parameters, Mapping) and len(parameters) > 1):
        lines.append(f"type {name} = (_: {_render_schema(parameters, 0)}) => any;")
    else:
        lines.append(f"type {name} = () => any;")
    return "\n".join(lines) + "\n"


def _render_schema(schema: object, depth: int) -> str:
    if not isinstance(schema, Mapping):
        return "any"
    if depth > 32:  # a schema that deep is hostile; its JSON is a safe upper bound
        return _compact_json(schema)
    extras = _render_extras(schema)
    if isinstance(schema.get("enum"), list):
        return " | ".join(json.dumps(v, ensure_ascii=False) for v in schema["enum"]) + extras
    if "const" in schema:
        return json.dumps(schema["const"], ensure_ascii=False) + extras
    for union in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(union), list):
            joiner = " & " if union == "allOf" else " | "
            return joiner.join(_render_schema(s, depth + 1) for s in schema[union]) + extras
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1] + extras
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(_render_schema({**schema, "type": k}, depth + 1) for k in kind)
    if kind == "array":
        return f"Array<{_render_schema(schema.get('items'), depth + 1)}>" + extras
    if kind == "object" or "properties" in schema:
        listed = schema.get("required")
        required = {r for r in listed if isinstance(r, str)} if isinstance(listed, list) else set()
        body: list[str] = ["{"]
        for key, prop in _properties(schema).items():
            if isinstance(prop, Mapping) and prop.get("description"):
                body += [f"// {line}" for line in _text(prop["description"]).splitlines()]
            optional = "" if key in required else "?"
            body.append(f"{key}{optional}: {_render_schema(prop, depth + 1)},")
        for defs_key in ("$defs", "definitions"):
            definitions = schema.get(defs_key)
            for def_name, def_schema in definitions.items() if isinstance(definitions, Mapping) else ():
                body.append(f"type {def_name} = {_render_schema(def_schema, depth + 1)};")
        body.append("}")
        return "\n".join(body) + extras
    if kind == "integer":
        return "number" + extras
    if isinstance(kind, str):
        return kind + extras
    return "any" + extras


def _render_extras(schema: Mapping[str, Any]) -> str:
    """Keywords the model is shown beside the type (formats, bounds, defaults, examples)."""
    shown = {
        k: v
        for k, v in schema.items()
        if k
        in (
            "default",
            "format",
            "minimum",
            "maximum",
            "minLength",
            "maxLength",
            "pattern",
            "examples",
            "minItems",
            "maxItems",
        )
    }
    return f" // {_compact_json(shown)}" if shown else ""


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _compact_json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), sort_keys=True, default=str)
