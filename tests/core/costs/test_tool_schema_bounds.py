"""Tool schemas that expand ($ref chains, type lists, deep nesting) cost bounded work, and their
count is never below the count of their full rendering."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.costs import tool_schema
from proxy.core.costs.tool_schema import BOUND_CAP, RENDER_BUDGET, expansion_bound, render_function, render_namespace
from proxy.core.costs.tools import functions_tokens
from proxy.core.models.model_registry import TokenizerSpec
from proxy.tokenizers.vocabularies import Tokenizers


def ref_chain(fan_out: int, depth: int, leaf: dict[str, Any] | None = None) -> dict[str, Any]:
    """A function whose `$defs` each refer to the next `fan_out` times, `depth` deep."""
    defs: dict[str, Any] = {}
    for i in range(depth):
        nxt = {"$ref": f"#/$defs/d{i + 1}"} if i + 1 < depth else (leaf or {"type": "string"})
        defs[f"d{i}"] = {"type": "object", "properties": {f"p{j}": nxt for j in range(fan_out)}}
    parameters = {"type": "object", "$defs": defs, "properties": {"x": {"$ref": "#/$defs/d0"}}}
    return {"name": "f", "description": "a chain", "parameters": parameters}


def type_lists(depth: int, kinds: int) -> dict[str, Any]:
    """`$defs` `depth` deep, each an object with a list of `kinds` types (the schema is rendered
    once per type) whose one property refers to the next."""
    defs: dict[str, Any] = {}
    for i in range(depth):
        nxt = {"$ref": f"#/$defs/t{i + 1}"} if i + 1 < depth else {"type": "string"}
        defs[f"t{i}"] = {"type": ["object"] * kinds, "properties": {"a": nxt}}
    parameters = {"type": "object", "$defs": defs, "properties": {"root": {"$ref": "#/$defs/t0"}}}
    return {"name": "g", "parameters": parameters}


leaves = st.sampled_from([{"type": "string"}, {"type": "integer", "description": "n\nm"}, {"enum": [1, "x"]}, {}])


@st.composite
def hostile_schemas(draw: st.DrawFn) -> dict[str, Any]:
    """Schemas made of the constructs that multiply: refs, type lists, anyOf, items, deep nesting."""

    def node(level: int) -> dict[str, Any]:
        if level == 0:
            return dict(draw(leaves))
        kind = draw(st.sampled_from(["ref", "types", "anyOf", "items", "object"]))
        if kind == "ref":
            return {"$ref": f"#/$defs/d{draw(st.integers(0, 2))}", "description": "see"}
        if kind == "types":
            return {"type": draw(st.lists(st.sampled_from(["object", "string", "array", "null"]), min_size=1, max_size=4)),
                    "properties": {"k": node(level - 1)}, "items": node(level - 1)}  # fmt: skip
        if kind == "anyOf":
            return {"anyOf": [node(level - 1) for _ in range(draw(st.integers(1, 3)))]}
        if kind == "items":
            return {"type": "array", "items": node(level - 1)}
        return {"type": "object", "properties": {f"p{i}": node(level - 1) for i in range(draw(st.integers(1, 3)))}}

    defs = {f"d{i}": node(draw(st.integers(0, 3))) for i in range(3)}
    properties = {f"q{i}": node(draw(st.integers(0, 4))) for i in range(draw(st.integers(1, 3)))}
    return {"name": "h", "parameters": {"type": "object", "$defs": defs, "properties": properties}}


class CountingSchema(tool_schema._Schema):
    calls = 0

    def type(self, schema: Any, indent: int, depth: int) -> str:
        CountingSchema.calls += 1
        return super().type(schema, indent, depth)


class TestRenderingWork:
    @pytest.mark.parametrize("function", [ref_chain(4, 20), ref_chain(2, 40), type_lists(12, 8)], ids=str)
    def test_an_exploding_schema_stops_at_the_budget(self, monkeypatch, function: dict[str, Any]) -> None:
        monkeypatch.setattr(tool_schema, "_Schema", CountingSchema)
        CountingSchema.calls = 0
        rendering = render_namespace([function])
        assert rendering.unrendered_bytes > RENDER_BUDGET
        assert CountingSchema.calls <= RENDER_BUDGET  # each visit is charged at least one unit
        assert any("bounded at" in note for note in rendering.estimates)

    @settings(max_examples=150, deadline=None)
    @given(hostile_schemas(), st.integers(64, 4096))
    def test_visits_never_exceed_the_budget(self, function: dict[str, Any], budget: int) -> None:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(tool_schema, "_Schema", CountingSchema)
            patch.setattr(tool_schema, "RENDER_BUDGET", budget)
            CountingSchema.calls = 0
            render_namespace([function])
        assert CountingSchema.calls <= budget + 1


class TestExpansionBound:
    @settings(max_examples=200, deadline=None)
    @given(hostile_schemas(), st.booleans())
    def test_the_bound_is_above_the_full_rendering(self, function: dict[str, Any], shows_all: bool) -> None:
        rendered = render_function(function, shows_all)
        if rendered.unrendered_bytes == 0:
            assert len(rendered.text.encode()) <= expansion_bound(function)

    @pytest.mark.parametrize("fan_out,depth", [(2, 6), (3, 5), (1, 24)])
    def test_the_bound_is_above_a_small_chain_rendered(self, fan_out: int, depth: int) -> None:
        function = ref_chain(fan_out, depth, {"type": "string", "description": "line\n" * 4})
        assert len(render_function(function, True).text.encode()) <= expansion_bound(function)

    def test_the_bound_is_capped(self) -> None:
        assert expansion_bound(ref_chain(8, 24)) == BOUND_CAP


@pytest.fixture(scope="module")
def o200k():  # type: ignore[no-untyped-def]
    return Tokenizers().get(TokenizerSpec("tiktoken", "o200k_base"))


class TestToolCounts:
    """The count of a namespace with a bounded function is never below its full rendering's."""

    def test_a_bounded_count_is_above_the_rendered_one(self, o200k, registry) -> None:  # type: ignore[no-untyped-def]
        fmt = registry.profile("gpt-4o").chat_format
        functions = [ref_chain(3, 6), {"name": "plain", "parameters": {"type": "object", "properties": {}}}]
        full = functions_tokens(functions, [], o200k, fmt)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(tool_schema, "RENDER_BUDGET", 2_000)  # the chain renders to more than this
            bounded = functions_tokens(functions, [], o200k, fmt)
        assert bounded.tokens >= full.tokens
        assert any("bounded at" in note for note in bounded.notes)

    def test_the_attack_of_the_issue_is_counted_over_any_window(self, o200k, registry) -> None:  # type: ignore[no-untyped-def]
        function = ref_chain(3, 13)  # about 2 KB of JSON: 3**13 copies of the leaf once written out
        assert len(json.dumps(function)) < 2_200
        count = functions_tokens([function], [], o200k, registry.profile("gpt-4o").chat_format)
        assert count.tokens > 10_000_000
