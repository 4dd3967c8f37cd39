"""OpenAI Responses: items in, chat view for the core, the cut written back into the items."""

from __future__ import annotations

import base64
import os
from typing import Any

import pytest

from proxy.apis.base import HeldContext, InvalidRequest
from proxy.apis.openai.responses import ResponsesAdapter
from proxy.core.counting.bound import CIPHERTEXT_TOKENS
from proxy.core.counting.request_count import RequestCounter
from proxy.core.trimming.turns import split_conversation
from tests.apis.fitting import fit_body, words
from tests.conftest import png_data_url
from tests.support.trimming import profile, tokenizer
from tests.support.validity import responses_problems

ADAPTER = ResponsesAdapter()


# Without the history guarantee and the partial turn, the one old turn can only go whole.
DROP_WHOLE_TURNS = {"drop_oldest_turns": {"min_history_turns": 0, "keep_partial": False}}


def agent_body() -> dict[str, Any]:
    return {
        "model": "gpt-4o",
        "instructions": "You are a research agent.",
        "input": [
            {"role": "user", "content": "first question " + words(700)},
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "I should search."}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "search", "arguments": '{"q": "a"}'},
            {"type": "function_call", "id": "fc_2", "call_id": "call_2", "name": "search", "arguments": '{"q": "b"}'},
            {"type": "function_call_output", "call_id": "call_2", "output": "result b " + words(400)},
            {"type": "function_call_output", "call_id": "call_1", "output": "result a " + words(400)},
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_1",
                "status": "completed",
                "content": [{"type": "output_text", "text": "answer " + words(200), "annotations": []}],
            },
            {"role": "user", "content": [{"type": "input_text", "text": "latest question"}]},
        ],
        "tools": [
            {
                "type": "function",
                "name": "search",
                "description": "Search the web",
                "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
                "strict": True,
            }
        ],
        "max_output_tokens": 400,
        "store": False,
        "metadata": {"run": "7"},
        "x-vendor-field": [1, {"k": "v"}],
    }


class TestParse:
    def test_instructions_become_a_pinned_system_message(self) -> None:
        parsed = ADAPTER.parse(agent_body())
        assert parsed.messages[0] == {"role": "system", "content": "You are a research agent."}
        assert parsed.where(0) == "instructions"

    def test_a_string_input_is_one_user_message(self) -> None:
        parsed = ADAPTER.parse({"model": "gpt-4o", "input": "hello"})
        assert parsed.messages == [{"role": "user", "content": "hello"}]

    def test_parallel_calls_share_one_assistant_message_with_the_reasoning_before_them(self) -> None:
        parsed = ADAPTER.parse(agent_body())
        calls = parsed.messages[2]
        assert [c["id"] for c in calls["tool_calls"]] == ["call_1", "call_2"]
        assert calls["reasoning_content"] == "I should search."
        assert parsed.where(2) == "input[1],input[2],input[3]"

    def test_a_call_and_its_outputs_form_one_atomic_unit(self) -> None:
        parsed = ADAPTER.parse(agent_body())
        conversation = split_conversation(parsed.messages)
        exchanges = [u.indices for t in conversation.turns for u in t.units if u.is_tool_exchange]
        assert exchanges == [(2, 3, 4)]

    def test_message_parts_map_to_chat_parts(self) -> None:
        body = {
            "model": "gpt-4o",
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "look"},
                        {"type": "input_image", "image_url": png_data_url(512, 512), "detail": "high"},
                        {"type": "input_file", "file_id": "file-1"},
                    ],
                }
            ],
        }
        content = ADAPTER.parse(body).messages[0]["content"]
        assert [p["type"] for p in content] == ["text", "image_url", "file"]
        assert content[1]["image_url"]["detail"] == "high"

    def test_function_tools_and_json_schema_formats_take_the_chat_shape(self) -> None:
        body = {
            **agent_body(),
            "text": {"format": {"type": "json_schema", "name": "r", "schema": {"type": "object"}, "strict": True}},
        }
        chat = ADAPTER.parse(body).chat
        assert chat["tools"][0] == {
            "type": "function",
            "function": {
                "name": "search",
                "description": "Search the web",
                "parameters": body["tools"][0]["parameters"],
                "strict": True,
            },
        }
        assert chat["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "r", "schema": {"type": "object"}, "strict": True},
        }
        assert chat["max_completion_tokens"] == 400

    def test_a_built_in_tool_makes_the_count_no_bound_and_names_it(self) -> None:
        parsed = ADAPTER.parse({**agent_body(), "tools": [{"type": "web_search"}]})
        assert parsed.server_state and not parsed.exact
        assert any(n.startswith("not counted, no bound") and "web_search" in n for n in parsed.notes)

    def test_a_function_tool_makes_the_count_a_bound(self) -> None:
        parsed = ADAPTER.parse({**agent_body(), "tools": [{"type": "function", "name": "f", "parameters": {}}]})
        assert not parsed.exact and not parsed.server_state

    def test_encrypted_reasoning_is_counted_by_its_ciphertext_with_the_item_it_precedes(self) -> None:
        """8,000 base64 characters decode to at most 6,000 bytes: at most 6,000 tokens, carried by
        the message of the item the reasoning precedes (so it goes with that item when cut)."""
        item = {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "Q" * 8_000}
        answer = {"role": "assistant", "content": "Done."}
        parsed = ADAPTER.parse({"model": "gpt-5", "input": [{"role": "user", "content": "hi"}, item, answer]})
        assert not parsed.server_state and not parsed.exact
        assert parsed.messages[1][CIPHERTEXT_TOKENS] == 6_000
        assert any("encrypted reasoning, an upper bound: 6,000 tokens" in n for n in parsed.notes)

    def test_only_a_reasoning_items_ciphertext_is_counted_as_one(self) -> None:
        """Several reasoning items before one item add up; a ciphertext on an item of another kind
        is not reasoning the provider decrypts into the context."""
        cipher = base64.b64encode(os.urandom(3_000)).decode()
        reasoning = {"type": "reasoning", "summary": [], "encrypted_content": cipher}
        answer = {"type": "message", "role": "assistant", "content": "Done.", "encrypted_content": "AAAA"}
        parsed = ADAPTER.parse({"model": "gpt-5", "input": [{"role": "user", "content": "hi"}, reasoning, reasoning, answer]})
        assert [m.get(CIPHERTEXT_TOKENS) for m in parsed.messages] == [None, 6_000]

    def test_a_file_sent_by_url_makes_the_count_no_bound(self) -> None:
        part = {"type": "input_file", "file_url": "https://example.com/a.pdf"}
        parsed = ADAPTER.parse({"model": "gpt-4o", "input": [{"role": "user", "content": [part]}]})
        assert parsed.server_state and any("fetches" in n for n in parsed.notes)

    def test_a_file_sent_inline_keeps_the_count_a_bound(self) -> None:
        part = {"type": "input_file", "filename": "a.txt", "file_data": "data:text/plain;base64,aGk="}
        assert not ADAPTER.parse({"model": "gpt-4o", "input": [{"role": "user", "content": [part]}]}).server_state

    def test_a_reasoning_mode_makes_the_count_no_bound(self) -> None:
        parsed = ADAPTER.parse({"model": "gpt-5.6-sol", "reasoning": {"mode": "pro"}, "input": "hi"})
        assert parsed.server_state and any("reasoning.mode" in n for n in parsed.notes)

    def test_a_reasoning_effort_alone_keeps_the_count_exact(self) -> None:
        parsed = ADAPTER.parse({"model": "gpt-5", "reasoning": {"effort": "low"}, "input": "hi"})
        assert parsed.exact and not parsed.server_state

    def test_context_management_makes_the_count_a_bound(self) -> None:
        body = {"model": "gpt-4.1", "context_management": [{"type": "compaction"}], "input": "hi"}
        parsed = ADAPTER.parse(body)
        assert not parsed.exact and not parsed.server_state

    def test_a_previous_response_id_marks_server_state_and_an_inexact_count(self) -> None:
        parsed = ADAPTER.parse({"model": "gpt-4o", "previous_response_id": "resp_1", "input": "and then?"})
        assert parsed.server_state and not parsed.exact

    def test_a_conversation_marks_server_state(self) -> None:
        assert ADAPTER.parse({"model": "gpt-4o", "conversation": "conv_1", "input": "hi"}).server_state

    def test_the_stored_response_and_conversation_named_are_held_context(self) -> None:
        parsed = ADAPTER.parse(
            {"model": "gpt-4o", "previous_response_id": "resp_1", "conversation": {"id": "conv_1"}, "input": "hi"}
        )
        assert parsed.held == (HeldContext("response", "resp_1"), HeldContext("conversation", "conv_1"))

    def test_a_prompt_template_is_not_held_context(self) -> None:
        parsed = ADAPTER.parse({"model": "gpt-4o", "prompt": {"id": "pmpt_1"}, "input": "hi"})
        assert parsed.server_state and parsed.held == ()

    def test_an_item_reference_is_pinned_and_flagged(self) -> None:
        parsed = ADAPTER.parse(
            {"model": "gpt-4o", "input": [{"type": "item_reference", "id": "msg_9"}, {"role": "user", "content": "hi"}]}
        )
        assert split_conversation(parsed.messages).pinned == (0,) and parsed.server_state

    def test_an_unknown_item_is_counted_as_its_json_and_flagged(self) -> None:
        parsed = ADAPTER.parse(
            {
                "model": "gpt-4o",
                "input": [
                    {"type": "web_search_call", "id": "ws_1", "status": "completed"},
                    {"role": "user", "content": "hi"},
                ],
            }
        )
        assert parsed.messages[0]["content"][0]["item"]["id"] == "ws_1" and parsed.server_state

    def test_computer_calls_pair_with_their_outputs_by_call_id(self) -> None:
        parsed = ADAPTER.parse(
            {
                "model": "gpt-4o",
                "input": [
                    {"role": "user", "content": "click"},
                    {"type": "computer_call", "call_id": "cc1", "action": {"type": "click"}},
                    {"type": "computer_call_output", "call_id": "cc1", "output": {"type": "computer_screenshot"}},
                    {"role": "user", "content": "next"},
                ],
            }
        )
        units = [u.indices for t in split_conversation(parsed.messages).turns for u in t.units if u.is_tool_exchange]
        assert units == [(1, 2)]

    @pytest.mark.parametrize(
        ("body", "param"),
        [
            ({"model": "gpt-4o", "input": 42}, "input"),
            ({"model": "gpt-4o", "input": ["text"]}, "input[0]"),
            ({"model": "gpt-4o", "input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
            ({"model": "gpt-4o", "input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
            (
                {"model": "gpt-4o", "input": [{"role": "user", "content": [{"type": "input_text"}]}]},
                "input[0].content[0].text",
            ),
            ({"model": "gpt-4o", "input": "x", "max_output_tokens": "many"}, "max_output_tokens"),
            ({"model": "gpt-4o", "instructions": 3}, "instructions"),
            ({"model": 7, "input": "x"}, "model"),
        ],
    )
    def test_a_malformed_body_is_refused_naming_the_field(self, body: dict[str, Any], param: str) -> None:
        with pytest.raises(InvalidRequest) as error:
            ADAPTER.parse(body)
        assert error.value.param == param


class TestCount:
    def test_a_responses_body_counts_as_the_same_chat_body(self) -> None:
        responses = {
            "model": "gpt-4o",
            "instructions": "Be brief.",
            "input": [
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": [{"type": "output_text", "text": "4"}]},
                {"role": "user", "content": "And 3+3?"},
            ],
        }
        chat = {
            "model": "gpt-4o",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "What is 2+2?"},
                {"role": "assistant", "content": [{"type": "text", "text": "4"}]},
                {"role": "user", "content": "And 3+3?"},
            ],
        }
        counter = RequestCounter(profile(128_000), tokenizer())
        assert fit_body(ADAPTER, responses, 128_000).plan.count.total == counter.request(chat).total

    def test_gpt_5_counts_two_more_per_assistant_message_of_the_history(self) -> None:
        history = [
            {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"},
            {"role": "assistant", "content": "Four."},
            {"role": "user", "content": "And 3+3?"},
        ]
        parsed = ADAPTER.parse({"model": "gpt-5", "input": history})
        chat = RequestCounter(profile(128_000, "gpt-5"), tokenizer("gpt-5")).request(parsed.chat)
        responses = RequestCounter(ADAPTER.profile(profile(128_000, "gpt-5"), parsed), tokenizer("gpt-5"))
        count = responses.request(parsed.chat)
        assert count.total == chat.total + 2 * 2 and count.exact

    def test_gpt_4o_counts_its_assistant_history_as_chat_does(self) -> None:
        parsed = ADAPTER.parse({"model": "gpt-4o", "input": [{"role": "assistant", "content": "4"}]})
        assert ADAPTER.profile(profile(128_000), parsed) == profile(128_000)

    def test_gpt_4_1_mini_counts_one_more_and_says_it_is_a_bound(self) -> None:
        parsed = ADAPTER.parse({"model": "gpt-4.1-mini", "input": "hi"})
        base = profile(128_000, "gpt-4.1-mini")
        count = RequestCounter(ADAPTER.profile(base, parsed), tokenizer()).request(parsed.chat)
        assert count.total == RequestCounter(base, tokenizer()).request(parsed.chat).total + 1 and not count.exact


class TestRender:
    def test_a_request_that_fits_is_forwarded_as_the_very_body_received(self) -> None:
        body = agent_body()
        assert fit_body(ADAPTER, body, 128_000).body is body

    def test_an_untouched_view_renders_the_original_body(self) -> None:
        parsed = ADAPTER.parse(agent_body())
        assert ADAPTER.render(parsed, parsed.chat, ()) == agent_body()

    def test_dropping_the_old_turn_drops_its_items_reasoning_and_calls_together(self) -> None:
        fitted = fit_body(ADAPTER, agent_body(), 1500, options=DROP_WHOLE_TURNS)
        assert fitted.plan.result.outcome == "trimmed"
        assert fitted.body["input"] == [agent_body()["input"][-1]]
        assert responses_problems(fitted.body) == []

    def test_the_report_names_where_each_removal_was_in_the_original_body(self) -> None:
        report = fit_body(ADAPTER, agent_body(), 1500, options=DROP_WHOLE_TURNS).report()
        # A strict function tool (the Responses default) has no measured rendering: not exact.
        assert report["api"] == "responses" and not report["exact"]
        assert [r["origin"] for r in report["removed"]][:3] == ["input[0]", "input[1],input[2],input[3]", "input[4]"]

    def test_every_field_outside_input_is_kept(self) -> None:
        fitted = fit_body(ADAPTER, agent_body(), 1500)
        original = agent_body()
        for key in ("instructions", "tools", "max_output_tokens", "store", "metadata", "x-vendor-field", "model"):
            assert fitted.body[key] == original[key]

    def test_a_long_function_call_output_is_shortened_in_place_keeping_the_item(self) -> None:
        body = {
            "model": "gpt-4o",
            "input": [
                {"role": "user", "content": "fetch it"},
                {"type": "function_call", "call_id": "c1", "name": "fetch", "arguments": "{}"},
                {
                    "type": "function_call_output",
                    "call_id": "c1",
                    "output": words(5000),
                    "id": "fco_1",
                    "status": "completed",
                },
            ],
        }
        fitted = fit_body(ADAPTER, body, 4000)
        output = fitted.body["input"][2]
        assert output["id"] == "fco_1" and output["status"] == "completed"
        assert "tokens removed" in output["output"] and len(output["output"]) < len(body["input"][2]["output"])
        assert fitted.plan.result.fits

    def test_a_shortened_text_part_keeps_its_other_fields(self) -> None:
        body = {
            "model": "gpt-4o",
            "input": [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "output_text", "text": words(5000), "annotations": [{"type": "url_citation"}]}
                    ],
                },
                {"role": "user", "content": "next"},
            ],
        }
        fitted = fit_body(ADAPTER, body, 4000, pipeline=("shrink_messages",))
        part = fitted.body["input"][1]["content"][0]
        assert part["annotations"] == [{"type": "url_citation"}] and "tokens removed" in part["text"]

    def test_a_dropped_image_becomes_an_input_text_marker(self) -> None:
        body = {
            "model": "gpt-4o",
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "see"},
                        {"type": "input_image", "image_url": png_data_url(2048, 2048), "detail": "high"},
                    ],
                },
                {"role": "assistant", "content": "nice"},
                {"role": "user", "content": "and now?"},
            ],
        }
        fitted = fit_body(ADAPTER, body, 1200, pipeline=("drop_images",))
        assert fitted.body["input"][0]["content"][1] == {"type": "input_text", "text": "[image removed]"}

    def test_a_lowered_output_reserve_is_written_to_max_output_tokens(self) -> None:
        body = {**agent_body(), "max_output_tokens": 5000}
        fitted = fit_body(
            ADAPTER, body, 6000, pipeline=("clamp_max_tokens",), options={"clamp_max_tokens": {"floor": 100}}
        )
        assert fitted.body["max_output_tokens"] < 5000 and "max_completion_tokens" not in fitted.body

    def test_a_long_string_input_is_cut_in_place(self) -> None:
        fitted = fit_body(ADAPTER, {"model": "gpt-4o", "input": words(5000)}, 3000)
        assert isinstance(fitted.body["input"], str) and "tokens removed" in fitted.body["input"]

    def test_long_instructions_are_cut_only_when_shrink_system_is_listed(self) -> None:
        body = {"model": "gpt-4o", "instructions": words(5000), "input": "hi"}
        fitted = fit_body(ADAPTER, body, 3000, pipeline=("shrink_system",))
        assert "tokens removed" in fitted.body["instructions"] and fitted.body["input"] == "hi"
        assert fit_body(ADAPTER, body, 3000).plan.result.outcome == "rejected"


class TestResponsesProblems:
    def test_an_output_without_its_call_is_a_problem(self) -> None:
        assert responses_problems({"input": [{"type": "function_call_output", "call_id": "c", "output": ""}]})

    def test_a_call_without_its_output_is_a_problem(self) -> None:
        assert responses_problems({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": ""}]})
