"""Properties of tool-definition counts over generated schemas (hypothesis): adding a property,
a description or an enum value never lowers the count, on either OpenAI tokenizer, with or
without a system message for the namespace to join."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.core.counting.request_count import RequestCounter
from tests.support.trimming import profile, tokenizer

WORDS = ["id", "name", "query", "limit", "unit", "a", "b", "数据", "río", "x1", "user_id", "tags"]
word = st.sampled_from(WORDS)
description = st.lists(st.sampled_from(["The", "city", "name", "in", "UTC", ":", "e.g.", "数据", "42", "."]), min_size=1, max_size=8).map(" ".join)  # fmt: skip
enum_value = st.sampled_from(["red", "green", "blue", "celsius", "a b", "数据", "x"])

scalar = st.fixed_dictionaries(
    {"type": st.sampled_from(["string", "number", "integer", "boolean"])},
    optional={"description": description},
)
enum_prop = st.fixed_dictionaries(
    {"type": st.just("string"), "enum": st.lists(enum_value, min_size=1, max_size=4, unique=True)},
    optional={"description": description},
)


def _object(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"type": st.just("object"), "properties": st.dictionaries(word, children, max_size=4)},
        optional={"description": description, "required": st.lists(word, max_size=2, unique=True)},
    )


prop = st.recursive(
    st.one_of(scalar, enum_prop),
    lambda children: st.one_of(_object(children), st.fixed_dictionaries({"type": st.just("array"), "items": children})),
    max_leaves=8,
)
function = st.fixed_dictionaries(
    {"name": st.sampled_from(["f", "get_weather", "search_docs"]), "parameters": _object(prop)},
    optional={"description": description},
)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _objects(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """Every object schema in `schema`, itself included."""
    found = [schema] if schema.get("type") == "object" else []
    for child in (schema.get("properties") or {}).values():
        found += _objects(child)
    if isinstance(schema.get("items"), dict):
        found += _objects(schema["items"])
    return found


def _schemas(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """Every property schema below `schema`."""
    found: list[dict[str, Any]] = []
    for child in (schema.get("properties") or {}).values():
        found += [child, *_schemas(child)]
    if isinstance(schema.get("items"), dict):
        found += [schema["items"], *_schemas(schema["items"])]
    return found


def _tokens(fn: dict[str, Any], model: str, system: bool) -> int:
    counter = RequestCounter(profile(128_000, model), tokenizer(model))
    messages = [{"role": "system", "content": "Be brief."}] if system else []
    body = {"messages": [*messages, {"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": fn}]}
    return counter.request(body).total


models = st.sampled_from(["gpt-4o", "gpt-3.5-turbo"])


@SETTINGS
@given(fn=function, data=st.data(), model=models, system=st.booleans())
def test_adding_a_property_never_lowers_the_count(fn, data, model, system):
    grown = copy.deepcopy(fn)
    target = data.draw(st.sampled_from(_objects(grown["parameters"])))
    key = data.draw(word.filter(lambda k: k not in target["properties"]), label="key")
    target["properties"][key] = data.draw(prop, label="property")
    assert _tokens(grown, model, system) >= _tokens(fn, model, system)


@SETTINGS
@given(fn=function, data=st.data(), model=models, system=st.booleans())
def test_adding_a_description_never_lowers_the_count(fn, data, model, system):
    grown = copy.deepcopy(fn)
    candidates = [s for s in [grown, *_schemas(grown["parameters"])] if "description" not in s]
    if not candidates:
        return
    data.draw(st.sampled_from(candidates))["description"] = data.draw(description, label="description")
    assert _tokens(grown, model, system) >= _tokens(fn, model, system)


@SETTINGS
@given(fn=function, data=st.data(), model=models, system=st.booleans())
def test_adding_an_enum_value_never_lowers_the_count(fn, data, model, system):
    grown = copy.deepcopy(fn)
    enums = [s for s in _schemas(grown["parameters"]) if "enum" in s]
    if not enums:
        return
    target = data.draw(st.sampled_from(enums))
    target["enum"].append(data.draw(enum_value.filter(lambda v: v not in target["enum"]), label="value"))
    assert _tokens(grown, model, system) >= _tokens(fn, model, system)
