"""Tool definitions, tool choice, tool calls and tool results: the rendering and its framing."""

from __future__ import annotations

import json

import pytest

from proxy.apis.openai.responses import ResponsesAdapter
from proxy.core.costs.tool_calls import parallel_results_text, parallel_uses_text, result_contexts
from proxy.core.costs.tool_schema import function_definition, render_function, render_namespace
from proxy.core.costs.tools import choice_tokens, functions_of, functions_tokens

WEATHER = {
    "name": "get_current_weather",
    "description": "Get the current weather in a given location",
    "parameters": {
        "type": "object",
        "properties": {
            "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
        },
        "required": ["location"],
    },
}


def _call(call_id: str, name: str = "lookup", arguments: str = '{"q": "x"}') -> dict[str, object]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


class TestFunctionDefinition:
    def test_a_chat_completions_tool_gives_its_function(self):
        assert function_definition({"type": "function", "function": WEATHER}) is WEATHER

    def test_a_responses_api_function_tool_is_its_own_definition(self):
        flat = {"type": "function", **WEATHER}
        assert function_definition(flat) is flat

    def test_hosted_and_custom_tools_have_no_function_definition(self):
        assert function_definition({"type": "web_search_preview"}) is None
        assert function_definition({"type": "custom", "custom": {"name": "x"}}) is None

    def test_tools_and_legacy_functions_are_gathered_together(self):
        body = {"tools": [{"type": "function", "function": WEATHER}, {"type": "file_search"}], "functions": [WEATHER]}
        functions, others = functions_of(body)
        assert functions == [WEATHER, WEATHER]
        assert others == [{"type": "file_search"}]


ADD_TOOL = {
    "type": "function",
    "name": "add",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"}}},
}


class TestResponsesFunctionTools:
    def _count(self, counter_for, tool):
        chat = ResponsesAdapter().parse({"model": "gpt-4.1", "input": "2 + 2?", "tools": [tool]}).chat
        return counter_for("gpt-4.1").request(chat)

    def test_a_responses_function_tool_is_strict_unless_it_says_otherwise_and_so_not_exact(self, counter_for):
        count = self._count(counter_for, ADD_TOOL)
        assert not count.exact and any("strict" in note for note in count.notes)

    def test_a_non_strict_responses_function_tool_counts_like_its_chat_form(self, counter_for):
        count = self._count(counter_for, {**ADD_TOOL, "strict": False})
        chat_tool = {"type": "function", "function": {k: v for k, v in ADD_TOOL.items() if k != "type"}}
        chat = {"messages": [{"role": "user", "content": "2 + 2?"}], "tools": [chat_tool]}
        assert count.exact and count.total == counter_for("gpt-4.1").request(chat).total


class TestRenderFunction:
    def test_a_function_is_rendered_as_a_typescript_declaration(self):
        assert render_function(WEATHER).text == (
            "// Get the current weather in a given location\n"
            "type get_current_weather = (_: {\n"
            "// The city and state, e.g. San Francisco, CA\n"
            "location: string,\n"
            'unit?: "celsius" | "fahrenheit", // default: "celsius"\n'
            "}) => any;\n"
        )

    def test_the_namespace_wraps_every_function_once(self):
        text = render_namespace([WEATHER, {"name": "ping", "parameters": {"type": "object", "properties": {}}}]).text
        assert text.startswith("namespace functions {\n\n")
        assert text.endswith("type ping = () => any;\n\n} // namespace functions")
        assert text.count("namespace functions {") == 1

    def test_nested_objects_indent_their_lines_but_not_their_closing_brace(self):
        schema = {
            "type": "object",
            "properties": {
                "outer": {"type": "object", "properties": {"inner": {"type": "object", "properties": {"x": {}}}}}
            },
        }
        text = render_function({"name": "f", "parameters": schema}).text
        assert "outer?: {\n  inner?: {\n    x?: any,\n}," in text

    def test_arrays_are_written_with_brackets_after_their_item_type(self):
        schema = {
            "type": "object",
            "properties": {
                "tags": {"type": "array", "items": {"type": "string"}},
                "rows": {"type": "array", "items": {"type": "object", "properties": {"n": {"type": "integer"}}}},
                "any": {"type": "array"},
            },
        }
        text = render_function({"name": "f", "parameters": schema}).text
        assert "tags?: string[]," in text and "rows?: {\n  n?: number,\n}[]," in text and "any?: any[]," in text

    def test_only_top_level_properties_show_their_descriptions(self):
        schema = {
            "type": "object",
            "properties": {
                "top": {
                    "type": "object",
                    "description": "shown",
                    "properties": {"deep": {"type": "string", "description": "hidden"}},
                }
            },
        }
        text = render_function({"name": "f", "parameters": schema}).text
        assert "// shown" in text and "hidden" not in text

    def test_anyof_is_a_union_and_const_is_not_shown(self):
        schema = {
            "type": "object",
            "properties": {"v": {"anyOf": [{"type": "string", "const": "a"}, {"type": "number"}]}},
        }
        assert "v?: string | number," in render_function({"name": "f", "parameters": schema}).text

    def test_a_schema_of_measured_keywords_renders_exactly(self):
        assert render_function(WEATHER).exact

    @pytest.mark.parametrize(
        ("schema", "reason"),
        [
            ({"type": "object", "properties": {"d": {"type": "string", "format": "date"}}}, "format"),
            ({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}}, "minimum"),
            ({"type": "object", "properties": {"v": {"oneOf": [{"type": "string"}]}}}, "oneOf"),
            ({"type": "object", "properties": {"v": {"type": ["string", "null"]}}}, "list of types"),
            (
                {"type": "object", "properties": {"v": {"$ref": "#/$defs/V"}}, "$defs": {"V": {"type": "string"}}},
                "$ref",
            ),
        ],
    )
    def test_unmeasured_constructs_make_the_rendering_an_estimate(self, schema, reason):
        rendering = render_function({"name": "f", "parameters": schema})
        assert not rendering.exact
        assert any(reason in estimate for estimate in rendering.estimates)

    def test_unmeasured_keywords_are_shown_so_that_they_are_counted(self):
        schema = {"type": "object", "properties": {"d": {"type": "string", "pattern": "^[a-z]+$"}}}
        assert "^[a-z]+$" in render_function({"name": "f", "parameters": schema}).text

    def test_a_ref_is_written_out_in_place(self):
        schema = {
            "type": "object",
            "properties": {"item": {"$ref": "#/$defs/Item"}},
            "$defs": {"Item": {"type": "object", "properties": {"sku": {"type": "string"}}}},
        }
        assert "item?: {\n  sku?: string,\n}," in render_function({"name": "f", "parameters": schema}).text

    def test_a_self_referencing_schema_ends(self):
        schema = {
            "type": "object",
            "properties": {"node": {"$ref": "#/$defs/N"}},
            "$defs": {"N": {"$ref": "#/$defs/N"}},
        }
        assert not render_function({"name": "f", "parameters": schema}).exact

    def test_multi_line_and_strict_functions_are_estimates(self):
        assert not render_function({"name": "f", "description": "one\ntwo"}).exact
        assert not render_function({**WEATHER, "strict": True}).exact


class TestFunctionsTokens:
    def test_the_namespace_joins_the_system_message_for_four_tokens_less_and_a_newline(self, counter_for):
        counter = counter_for("gpt-4o")
        alone = functions_tokens([WEATHER], [{"role": "user", "content": "hi"}], counter.tokenizer, counter.fmt)
        joined = functions_tokens(
            [WEATHER], [{"role": "system", "content": "Be brief."}], counter.tokenizer, counter.fmt
        )
        newline = counter.text("Be brief.\n") - counter.text("Be brief.")
        assert joined.tokens == alone.tokens - 4 + newline

    def test_the_newline_can_merge_with_the_system_messages_last_characters(self, counter_for):
        counter = counter_for("gpt-3.5-turbo")
        plain = functions_tokens([WEATHER], [{"role": "system", "content": "Hello"}], counter.tokenizer, counter.fmt)
        colon = functions_tokens([WEATHER], [{"role": "system", "content": "Hello:"}], counter.tokenizer, counter.fmt)
        assert colon.tokens == plain.tokens - 1

    def test_a_developer_message_alone_is_not_assumed_to_take_the_namespace(self, counter_for):
        counter = counter_for("o3")
        user = functions_tokens([WEATHER], [{"role": "user", "content": "hi"}], counter.tokenizer, counter.fmt)
        developer = functions_tokens(
            [WEATHER], [{"role": "developer", "content": "hi"}], counter.tokenizer, counter.fmt
        )
        assert developer.tokens == user.tokens

    def test_a_reasoning_model_adds_the_frame_measured_around_its_tools_and_says_it_is_a_bound(self, counter_for):
        functions = [{"name": "get_file", "parameters": {"type": "object", "properties": {}}}]
        reasoning = functions_tokens(functions, [], counter_for("gpt-5-mini").tokenizer, counter_for("gpt-5-mini").fmt)
        chat = functions_tokens(functions, [], counter_for("gpt-4o").tokenizer, counter_for("gpt-4o").fmt)
        assert reasoning.tokens == chat.tokens + 85
        assert not reasoning.exact and chat.exact

    def test_a_reasoning_model_is_counted_every_title_description_and_example_at_every_depth(self, counter_for):
        """harmony (gpt-oss, and the reasoning models' renderer) shows them all; the measured 2023
        rule shows top-level descriptions only. A nested model's fields must not count as nothing."""
        note = "Free text on what this field means downstream, its units and its empty value. " * 4
        field = {"type": "string", "title": "A Field Of The Line Item", "description": note, "examples": ["x-1"]}
        item = {"type": "object", "description": note, "properties": {f"f{i}": field for i in range(10)}}
        schema = {"type": "object", "properties": {"items": {"type": "array", "items": item}}}
        functions = [{"name": "submit", "parameters": schema}]
        oss = counter_for("gpt-oss-120b")
        reasoning = functions_tokens(functions, [], oss.tokenizer, oss.fmt)
        gpt = counter_for("gpt-4o")
        measured = functions_tokens(functions, [], gpt.tokenizer, gpt.fmt)
        shown = 11 * oss.text(note) + 10 * oss.text("A Field Of The Line Item")  # at least what is written
        assert reasoning.tokens > shown > measured.tokens and not reasoning.exact

    def test_template_families_count_their_json_as_an_estimate_above_the_namespace(self, counter_for):
        claude = counter_for("claude-sonnet-4-5")
        gpt = counter_for("gpt-4o")
        messages = [{"role": "user", "content": "hi"}]
        bound = functions_tokens([WEATHER], messages, claude.tokenizer, claude.fmt)
        assert not bound.exact
        assert bound.tokens > functions_tokens([WEATHER], messages, gpt.tokenizer, gpt.fmt).tokens


class TestChoiceTokens:
    @pytest.mark.parametrize(("choice", "expected"), [("auto", 0), ("none", 1)])
    def test_legacy_function_call_auto_and_none_cost_what_the_api_counts(self, counter_for, choice, expected):
        counter = counter_for("gpt-3.5-turbo")
        count = choice_tokens({"function_call": choice}, [WEATHER], counter.tokenizer, counter.fmt)
        assert (count.tokens, count.exact) == (expected, True)

    def test_forcing_a_function_costs_four_tokens_and_its_name(self, counter_for):
        counter = counter_for("gpt-3.5-turbo")
        count = choice_tokens(
            {"function_call": {"name": "get_current_weather"}}, [WEATHER], counter.tokenizer, counter.fmt
        )
        assert count.tokens == 4 + counter.text("get_current_weather")

    @pytest.mark.parametrize(
        "choice",
        [
            {"type": "function", "function": {"name": "get_current_weather"}},
            {"type": "function", "name": "get_current_weather"},  # Responses API
        ],
    )
    def test_tool_choice_forcing_counts_like_function_call_and_says_it_is_unmeasured(self, counter_for, choice):
        counter = counter_for("gpt-4o")
        count = choice_tokens({"tool_choice": choice}, [WEATHER], counter.tokenizer, counter.fmt)
        assert count.tokens == 4 + counter.text("get_current_weather")
        assert not count.exact

    def test_required_is_bounded_by_forcing_the_longest_named_function(self, counter_for):
        counter = counter_for("gpt-4o")
        required = choice_tokens({"tool_choice": "required"}, [WEATHER], counter.tokenizer, counter.fmt)
        forced = choice_tokens(
            {"tool_choice": {"type": "function", "name": "get_current_weather"}},
            [WEATHER],
            counter.tokenizer,
            counter.fmt,
        )
        assert required.tokens >= forced.tokens
        assert not required.exact


class TestToolCalls:
    def test_one_call_costs_its_framing_its_name_after_the_dot_and_its_arguments_as_sent(self, counter_for):
        counter = counter_for("gpt-4o")
        message = counter.message({"role": "assistant", "content": None, "tool_calls": [_call("a")]}, 0)
        fmt = counter.fmt
        expected = fmt.function_call_overhead + counter.text(".lookup") + counter.text('{"q": "x"}')
        assert message.tool_call_tokens == expected
        assert not message.notes

    def test_a_name_that_splits_after_the_dot_costs_what_it_costs_there(self, counter_for):
        counter = counter_for("gpt-3.5-turbo")
        call = {"id": "a", "type": "function", "function": {"name": "calculator", "arguments": "{}"}}
        message = counter.message({"role": "assistant", "tool_calls": [call]}, 0)
        assert counter.text("calculator") == 1 and counter.text(".calculator") == 2
        assert message.tool_call_tokens == counter.fmt.function_call_overhead + 2 + counter.text("{}")

    def test_the_call_id_is_not_counted(self, counter_for):
        counter = counter_for("gpt-4o")
        short = counter.message({"role": "assistant", "tool_calls": [{**_call("a"), "id": "a"}]}, 0)
        long = counter.message({"role": "assistant", "tool_calls": [{**_call("a"), "id": "call_" + "x" * 24}]}, 0)
        assert short.tokens == long.tokens

    def test_a_template_family_adds_its_margin_per_call_and_says_so(self, counter_for):
        counter = counter_for("llama-3.1-8b-instruct")
        message = counter.message({"role": "assistant", "tool_calls": [_call("a")]}, 0)
        assert counter.fmt.tool_call_margin > 0 and message.notes

    def test_whitespace_inside_the_arguments_of_one_call_is_counted_as_sent(self, counter_for):
        counter = counter_for("gpt-4o")
        tight = counter.message({"role": "assistant", "tool_calls": [_call("a", arguments='{"q":"x"}')]}, 0)
        loose = counter.message({"role": "assistant", "tool_calls": [_call("a", arguments='{ "q" :\n\n "x" }')]}, 0)
        assert loose.tokens - tight.tokens == counter.text('{ "q" :\n\n "x" }') - counter.text('{"q":"x"}')

    def test_parallel_calls_are_one_call_to_the_parallel_wrapper(self, counter_for):
        counter = counter_for("gpt-3.5-turbo-0613")
        calls = [_call("a"), _call("b", "fetch", '{"url": "u"}')]
        message = counter.message({"role": "assistant", "tool_calls": calls}, 0)
        uses, parsed = parallel_uses_text(calls)
        assert parsed and json.loads(uses) == {
            "tool_uses": [
                {"recipient_name": "lookup", "parameters": {"q": "x"}},
                {"recipient_name": "fetch", "parameters": {"url": "u"}},
            ]
        }
        assert message.tool_call_tokens == counter.fmt.function_call_overhead + counter.text(uses)
        assert not message.notes

    def test_parallel_calls_on_todays_models_carry_their_call_framing_and_say_it_is_unmeasured(self, counter_for):
        calls = [_call("a"), _call("b", "fetch", '{"url": "u"}')]
        old, new = counter_for("gpt-3.5-turbo-0613"), counter_for("gpt-3.5-turbo")
        then = old.message({"role": "assistant", "tool_calls": calls}, 0)
        now = new.message({"role": "assistant", "tool_calls": calls}, 0)
        assert now.tool_call_tokens == then.tool_call_tokens + 3 and now.notes

    def test_one_call_on_todays_models_costs_three_more_than_on_the_0613_models(self, counter_for):
        call = {"role": "assistant", "tool_calls": [_call("a")]}
        then = counter_for("gpt-3.5-turbo-0613").message(call, 0)
        assert counter_for("gpt-3.5-turbo").message(call, 0).tokens == then.tokens + 3

    def test_gpt_4_is_the_0613_model_and_frames_calls_as_measured_then(self, counter_for):
        call = {"role": "assistant", "tool_calls": [_call("a")]}
        now = counter_for("gpt-4").message(call, 0)
        assert now.tokens == counter_for("gpt-3.5-turbo-0613").message(call, 0).tokens and not now.notes

    def test_a_model_whose_calls_were_never_measured_takes_todays_framing_and_says_so(self, counter_for):
        turbo = counter_for("gpt-4-turbo")
        message = turbo.message({"role": "assistant", "tool_calls": [_call("a")]}, 0)
        assert turbo.fmt.function_call_overhead == counter_for("gpt-4o").fmt.function_call_overhead
        assert message.tool_call_tokens == turbo.fmt.function_call_overhead + turbo.text(".lookup") + turbo.text(
            '{"q": "x"}'
        )
        assert message.notes

    def test_whitespace_inside_parallel_arguments_is_normalised(self, counter_for):
        counter = counter_for("gpt-4o")
        tight = [_call("a", arguments='{"q":"x"}'), _call("b")]
        loose = [_call("a", arguments='{ "q" :\n "x" }'), _call("b")]
        assert (
            counter.message({"role": "assistant", "tool_calls": tight}, 0).tokens
            == counter.message({"role": "assistant", "tool_calls": loose}, 0).tokens
        )


class TestToolResults:
    def test_the_result_of_one_call_counts_as_a_function_message_named_after_the_call(self, counter_for):
        counter = counter_for("gpt-4o")
        body = {
            "messages": [
                {"role": "assistant", "tool_calls": [_call("a", "get_current_weather")]},
                {"role": "tool", "tool_call_id": "a", "content": "sunny"},
            ]
        }
        as_function = counter.message({"role": "function", "name": "get_current_weather", "content": "sunny"}, 1)
        assert counter.request(body).messages[1].tokens == as_function.tokens

    def test_a_result_that_answers_no_call_is_named_by_its_id_and_flagged(self, counter_for):
        counter = counter_for("gpt-4o")
        count = counter.request({"messages": [{"role": "tool", "tool_call_id": "call_orphan", "content": "x"}]})
        assert any("no earlier call" in note for note in count.notes)
        assert not count.exact

    def test_the_results_of_a_parallel_call_cost_their_joined_list_and_its_framing(self, counter_for):
        counter = counter_for("gpt-4o")
        results = ["sunny, 21C", 'He said "hi"\n', ""]
        body = {
            "messages": [
                {"role": "assistant", "tool_calls": [_call("a"), _call("b"), _call("c")]},
                *({"role": "tool", "tool_call_id": i, "content": r} for i, r in zip("abc", results, strict=True)),
            ]
        }
        count = counter.request(body)
        joined = counter.text(parallel_results_text(results)) + counter.fmt.parallel_results_overhead
        assert sum(m.tokens for m in count.messages[1:]) == joined

    def test_non_ascii_results_of_a_parallel_call_are_escaped_and_cost_more(self, counter_for):
        counter = counter_for("gpt-4o")
        korean = "테스트 " * 20

        def body(n):
            calls = [_call(f"c{i}") for i in range(n)]
            results = [{"role": "tool", "tool_call_id": f"c{i}", "content": korean} for i in range(n)]
            return {"messages": [{"role": "assistant", "tool_calls": calls}, *results]}

        single = counter.request(body(1)).messages[1].tokens
        parallel = counter.request(body(2)).messages[1].tokens
        assert parallel > 3 * single

    def test_a_result_recounted_alone_costs_what_it_cost_in_its_request(self, counter_for):
        counter = counter_for("gpt-4o")
        messages = [
            {"role": "assistant", "tool_calls": [_call("a"), _call("b")]},
            {"role": "tool", "tool_call_id": "b", "content": "second"},
            {"role": "tool", "tool_call_id": "a", "content": "first"},
        ]
        count = counter.request({"messages": messages})
        assert [counter.message(m, i).tokens for i, m in enumerate(messages)] == [m.tokens for m in count.messages]

    def test_the_cache_keeps_results_of_different_calls_apart(self, registry, tokenizers):
        from proxy.core.counting.count_cache import CountCache
        from proxy.core.counting.request_count import RequestCounter

        profile = registry.profile("gpt-4o")
        cache = CountCache(1000)
        result = {"role": "tool", "tool_call_id": "a", "content": "ok"}

        def count(name):
            counter = RequestCounter(profile, tokenizers.get(profile.tokenizer), cache)
            return counter.request({"messages": [{"role": "assistant", "tool_calls": [_call("a", name)]}, result]})

        assert count("a_much_longer_function_name").messages[1].tokens > count("f").messages[1].tokens

    def test_results_are_matched_to_calls_by_id_and_parallel_groups_know_their_ends(self):
        messages = [
            {"role": "assistant", "tool_calls": [_call("a", "one"), _call("b", "two")]},
            {"role": "tool", "tool_call_id": "b", "content": ""},
            {"role": "tool", "tool_call_id": "a", "content": ""},
            {"role": "assistant", "tool_calls": [_call("c", "three")]},
            {"role": "tool", "tool_call_id": "c", "content": ""},
        ]
        contexts = result_contexts(messages)
        assert (contexts[1].name, contexts[1].group, contexts[1].first, contexts[1].last) == ("two", 0, True, False)
        assert (contexts[2].name, contexts[2].first, contexts[2].last) == ("one", False, True)
        assert (contexts[4].name, contexts[4].group) == ("three", None)

    def test_template_families_bound_calls_and_results_and_say_so(self, counter_for):
        counter = counter_for("qwen3-32b")
        body = {
            "messages": [
                {"role": "assistant", "tool_calls": [_call("a"), _call("b")]},
                {"role": "tool", "tool_call_id": "a", "content": "x"},
                {"role": "tool", "tool_call_id": "b", "content": "y"},
            ]
        }
        count = counter.request(body)
        assert not count.exact
        assert count.messages[1].tokens >= counter.fmt.per_message + counter.text("x")


class TestExactness:
    def test_a_chat_with_measured_tools_is_exact(self, counter_for):
        body = {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": WEATHER}]}
        assert counter_for("gpt-4o").request(body).exact

    @pytest.mark.parametrize(
        "extra",
        [
            {"tools": [{"type": "web_search_preview"}]},
            {"functions": [{"name": "f", "parameters": {"type": "object", "properties": {"d": {"format": "date"}}}}]},
            {"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}}},
            {"tool_choice": "required", "tools": [{"type": "function", "function": WEATHER}]},
        ],
    )
    def test_any_estimated_part_makes_the_count_inexact(self, counter_for, extra):
        count = counter_for("gpt-4o").request({"messages": [{"role": "user", "content": "hi"}], **extra})
        assert not count.exact
        assert count.notes
