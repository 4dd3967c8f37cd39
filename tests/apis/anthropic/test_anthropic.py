"""Anthropic Messages: blocks in, chat view for the core, the cut written back into the blocks."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from proxy.apis.anthropic.messages import ANTHROPIC_IMAGES, CountTokensAdapter, MessagesAdapter, count_tokens_body
from proxy.apis.base import InvalidRequest
from proxy.core.learning.corrections import parse_overflow
from proxy.core.trimming.turns import split_conversation
from proxy.errors import BadRequest, HTTPRefusal
from proxy.tokenizers.vocabularies import bundled_encodings_dir
from tests.apis.fitting import fit_body, words
from tests.conftest import png_data_url
from tests.support.trimming import profile
from tests.support.validity import messages_problems

ADAPTER = MessagesAdapter()
CLAUDE = "claude-sonnet-4-5"
SAMPLES = sorted((Path(__file__).parents[2] / "data" / "samples").glob("*.txt"))


def png_source(width: int, height: int) -> dict[str, Any]:
    return {"type": "base64", "media_type": "image/png", "data": png_data_url(width, height).split(",", 1)[1]}


def agent_body() -> dict[str, Any]:
    return {
        "model": CLAUDE,
        "max_tokens": 1024,
        "system": [{"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "Fix the failing test. " + words(600)},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "I should read the file.", "signature": "sig-1"},
                    {"type": "text", "text": "Reading it."},
                    {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a.py"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": "def f(): " + words(900),
                        "cache_control": {"type": "ephemeral"},
                    },
                    {"type": "text", "text": "Also check b.py"},
                ],
            },
            {"role": "assistant", "content": "Done: " + words(200)},
            {"role": "user", "content": "Now run the tests."},
        ],
        "tools": [
            {
                "name": "read",
                "description": "Read a file",
                "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
            }
        ],
        "metadata": {"user_id": "u-1"},
        "x-vendor": {"keep": True},
    }


class TestParse:
    def test_the_system_blocks_become_one_pinned_system_message(self) -> None:
        parsed = ADAPTER.parse(agent_body())
        assert parsed.messages[0] == {
            "role": "system",
            "content": [{"type": "text", "text": "You are a coding agent."}],
        }

    def test_tool_use_becomes_a_tool_call_and_thinking_is_counted_as_reasoning(self) -> None:
        assistant = ADAPTER.parse(agent_body()).messages[2]
        assert assistant["tool_calls"] == [
            {"id": "toolu_1", "type": "function", "function": {"name": "read", "arguments": '{"path": "a.py"}'}}
        ]
        assert assistant["reasoning_content"] == "I should read the file."
        assert assistant["content"] == [{"type": "text", "text": "Reading it."}]

    def test_a_tool_result_becomes_a_tool_message_before_the_rest_of_its_user_message(self) -> None:
        parsed = ADAPTER.parse(agent_body())
        assert [m["role"] for m in parsed.messages[3:5]] == ["tool", "user"]
        assert parsed.where(3) == "messages[2].content[0]" and parsed.where(4) == "messages[2].content[1]"

    def test_a_tool_use_and_its_tool_result_are_one_atomic_unit(self) -> None:
        conversation = split_conversation(ADAPTER.parse(agent_body()).messages)
        exchanges = [u.indices for t in conversation.turns for u in t.units if u.is_tool_exchange]
        assert exchanges == [(2, 3)]

    def test_tools_take_the_chat_shape_and_add_anthropics_tool_prompt(self) -> None:
        parsed = ADAPTER.parse(agent_body())
        assert parsed.chat["tools"][0]["function"]["parameters"] == agent_body()["tools"][0]["input_schema"]
        assert parsed.fixed_tokens == 346

    def test_a_forced_tool_choice_adds_the_smaller_tool_prompt(self) -> None:
        parsed = ADAPTER.parse({**agent_body(), "tool_choice": {"type": "any"}})
        assert parsed.fixed_tokens == 313

    def test_a_web_search_result_sent_back_is_counted_as_its_json_and_said_to_be_an_estimate(self) -> None:
        """The model reads the pages its `encrypted_content` stands for, which the guard cannot."""
        result = {
            "type": "web_search_tool_result",
            "tool_use_id": "srvtoolu_1",
            "content": [{"type": "web_search_result", "url": "https://example.com", "title": "Example",
                         "encrypted_content": "RW5jcnlwdGVk" * 200, "page_age": None}],
        }  # fmt: skip
        turn = {"role": "assistant", "content": [{"type": "text", "text": "Searching."}, result]}
        body = {**agent_body(), "messages": [*agent_body()["messages"], turn, {"role": "user", "content": "go on"}]}
        parsed = ADAPTER.parse(body)
        assert not parsed.exact and any("web_search_tool_result counted as its JSON" in n for n in parsed.notes)
        assert (
            fit_body(ADAPTER, body, 200_000, model=CLAUDE).plan.count.total
            > fit_body(ADAPTER, agent_body(), 200_000, model=CLAUDE).plan.count.total + 200
        )

    def test_anthropic_defined_tools_add_their_published_prompt_tokens(self) -> None:
        parsed = ADAPTER.parse(
            {**agent_body(), "tools": [{"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}]}
        )
        assert parsed.fixed_tokens == 700 + 346 and not parsed.exact

    def test_a_tool_s_input_examples_are_counted_with_it_as_their_json(self) -> None:
        """Anthropic shows a tool's `input_examples` to the model: a client's hundred examples are
        as much prompt as a hundred messages."""
        body = agent_body()
        examples = [{"path": f"src/module_{i}.py", "reason": words(30)} for i in range(100)]
        with_examples = {**body, "tools": [{**body["tools"][0], "input_examples": examples}]}
        counted = fit_body(ADAPTER, with_examples, 200_000, model=CLAUDE).plan.count
        plain = fit_body(ADAPTER, body, 200_000, model=CLAUDE).plan.count
        assert counted.components["tool_definitions"] - plain.components["tool_definitions"] >= 100 * 30
        assert any("input_examples counted as their JSON" in note for note in ADAPTER.parse(with_examples).notes)

    def test_the_tool_prompt_is_part_of_the_count(self) -> None:
        with_tools = fit_body(ADAPTER, agent_body(), 200_000, model=CLAUDE).plan.count
        body = agent_body()
        del body["tools"]
        without = fit_body(ADAPTER, body, 200_000, model=CLAUDE).plan.count
        assert with_tools.total - without.total >= 346

    def test_images_are_priced_by_anthropics_rule_whatever_the_model(self) -> None:
        body = {
            "model": "gpt-4o",
            "max_tokens": 100,
            "messages": [{"role": "user", "content": [{"type": "image", "source": png_source(1000, 1000)}]}],
        }
        count = fit_body(ADAPTER, body, 200_000).plan.count
        assert count.components["images"] == math.ceil(1000 * 1000 / 750)

    def test_requests_of_different_models_in_turn_each_count_with_their_own_profile_priced(self) -> None:
        """A model's requests count with its route's one profile: its priced copy is made once, and
        a request of another model in between never gets it."""
        adapter = MessagesAdapter()
        parsed = adapter.parse({"model": CLAUDE, "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]})
        small, large = profile(8_000, "gpt-4o"), profile(200_000, "gpt-4o-mini")
        first = adapter.profile(small, parsed)
        assert adapter.profile(small, parsed) is first
        other = adapter.profile(large, parsed)
        again = adapter.profile(small, parsed)
        assert (other.name, other.context_window) == ("gpt-4o-mini", 200_000)
        assert (again.name, again.context_window) == ("gpt-4o", 8_000)
        assert {first.images, other.images, again.images} == {ANTHROPIC_IMAGES} != {small.images}

    def test_a_remote_image_is_priced_at_the_most_an_image_can_cost(self) -> None:
        body = {
            "model": CLAUDE,
            "max_tokens": 100,
            "messages": [
                {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]}
            ],
        }
        assert fit_body(ADAPTER, body, 200_000, model=CLAUDE).plan.count.components["images"] == 1600

    def test_a_plain_text_document_is_counted_as_its_text(self) -> None:
        body = {
            "model": CLAUDE,
            "max_tokens": 100,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "document",
                            "source": {"type": "text", "media_type": "text/plain", "data": "hello world"},
                        }
                    ],
                }
            ],
        }
        assert ADAPTER.parse(body).messages[0]["content"] == [{"type": "text", "text": "hello world"}]

    def test_a_document_s_title_and_context_are_counted_and_kept_as_sent_through_a_trim(self) -> None:
        """The model is shown them with the document (Anthropic's citations): they are counted,
        and a trim that shortens the document's text leaves them as they came."""
        context = "Background the reader needs: " + words(2000)

        def body(**shown: str) -> dict[str, Any]:
            document = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": words(3000)}}
            later = [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "and so?"}]
            return {"model": CLAUDE, "max_tokens": 100, "messages": [
                {"role": "user", "content": [{**document, **shown}, {"type": "text", "text": "read this"}]}, *later
            ]}  # fmt: skip

        plain = fit_body(ADAPTER, body(), 200_000, model=CLAUDE).plan.count.total
        shown = fit_body(ADAPTER, body(title="Q3 notes", context=context), 200_000, model=CLAUDE).plan.count.total
        assert shown - plain >= 2000
        trimmed = fit_body(ADAPTER, body(title="Q3 notes", context=context), 5000, model=CLAUDE)
        block = trimmed.body["messages"][0]["content"][0]
        assert trimmed.plan.result.outcome == "trimmed" and (block["title"], block["context"]) == ("Q3 notes", context)

    def test_redacted_thinking_makes_the_count_an_estimate(self) -> None:
        body = {
            "model": CLAUDE,
            "max_tokens": 100,
            "messages": [
                {"role": "user", "content": "q"},
                {
                    "role": "assistant",
                    "content": [{"type": "redacted_thinking", "data": "xyz"}, {"type": "text", "text": "a"}],
                },
                {"role": "user", "content": "q2"},
            ],
        }
        assert not ADAPTER.parse(body).exact

    @pytest.mark.parametrize(
        ("body", "param"),
        [
            ({"model": CLAUDE, "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
            ({"model": CLAUDE, "max_tokens": 10, "messages": []}, "messages"),
            ({"model": CLAUDE, "max_tokens": 10, "messages": [{"role": "system", "content": "hi"}]}, "messages.0.role"),
            ({"model": CLAUDE, "max_tokens": 10, "messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
            (
                {
                    "model": CLAUDE,
                    "max_tokens": 10,
                    "messages": [{"role": "user", "content": [{"type": "tool_result"}]}],
                },
                "messages.0.content.0.tool_use_id",
            ),
            (
                {"model": CLAUDE, "max_tokens": 10, "system": 5, "messages": [{"role": "user", "content": "x"}]},
                "system",
            ),
        ],
    )
    def test_a_malformed_body_is_refused_naming_the_field(self, body: dict[str, Any], param: str) -> None:
        with pytest.raises(InvalidRequest) as error:
            ADAPTER.parse(body)
        assert error.value.param == param


class TestCountTokens:
    def test_count_tokens_needs_no_max_tokens(self) -> None:
        parsed = CountTokensAdapter().parse({"model": CLAUDE, "messages": [{"role": "user", "content": "hi"}]})
        assert parsed.chat.get("max_tokens") is None

    def test_the_answer_is_the_input_token_count(self) -> None:
        assert count_tokens_body(1234) == {"input_tokens": 1234}


class TestClaudeEstimate:
    @pytest.mark.parametrize("sample", SAMPLES, ids=[s.stem for s in SAMPLES])
    def test_a_messages_body_never_counts_below_claudes_published_tokenizer(self, sample: Path) -> None:
        from tokenizers import Tokenizer

        published = Tokenizer.from_file(str(bundled_encodings_dir() / "anthropic_tokenizer.json"))
        text = sample.read_text(encoding="utf-8")
        body = {"model": CLAUDE, "max_tokens": 100, "system": text, "messages": [{"role": "user", "content": text}]}
        real = 2 * len(published.encode(text, add_special_tokens=False).ids)
        assert fit_body(ADAPTER, body, 200_000, model=CLAUDE).plan.count.total >= real


class TestRender:
    def test_a_request_that_fits_is_forwarded_as_the_very_body_received(self) -> None:
        body = agent_body()
        assert fit_body(ADAPTER, body, 200_000, model=CLAUDE).body is body

    def test_an_untouched_view_renders_the_original_body(self) -> None:
        parsed = ADAPTER.parse(agent_body())
        assert ADAPTER.render(parsed, parsed.chat, ()) == agent_body()

    def test_dropping_the_old_turn_keeps_a_valid_conversation_that_opens_with_the_user(self) -> None:
        fitted = fit_body(ADAPTER, agent_body(), 3000, model=CLAUDE)
        assert fitted.plan.result.outcome == "trimmed"
        messages = fitted.body["messages"]
        assert messages[0]["role"] == "user" and messages_problems(fitted.body) == []
        assert not any(
            b.get("type") == "tool_result" for m in messages if isinstance(m["content"], list) for b in m["content"]
        )

    def test_the_text_beside_a_dropped_tool_result_stays(self) -> None:
        fitted = fit_body(ADAPTER, agent_body(), 3000, model=CLAUDE)
        assert fitted.body["messages"][0] == {"role": "user", "content": [{"type": "text", "text": "Also check b.py"}]}

    def test_every_field_outside_messages_is_kept(self) -> None:
        fitted = fit_body(ADAPTER, agent_body(), 3000, model=CLAUDE)
        for key in ("system", "tools", "metadata", "x-vendor", "max_tokens", "model"):
            assert fitted.body[key] == agent_body()[key]

    def test_a_long_tool_result_is_shortened_in_place_keeping_its_fields(self) -> None:
        body = agent_body()
        body["messages"][2]["content"][0]["content"] = words(6000)
        fitted = fit_body(ADAPTER, body, 6000, model=CLAUDE, pipeline=("shrink_tool_results",))
        result = fitted.body["messages"][2]["content"][0]
        assert result["cache_control"] == {"type": "ephemeral"} and result["tool_use_id"] == "toolu_1"
        assert "tokens removed" in result["content"] and fitted.plan.result.fits

    def test_thinking_stays_intact_with_its_message(self) -> None:
        body = agent_body()
        body["messages"][2]["content"][0]["content"] = words(6000)
        fitted = fit_body(ADAPTER, body, 6000, model=CLAUDE, pipeline=("shrink_tool_results",))
        assert fitted.body["messages"][1] == agent_body()["messages"][1]

    def test_shortened_system_blocks_keep_their_cache_control(self) -> None:
        body = {
            **agent_body(),
            "system": [{"type": "text", "text": words(8000), "cache_control": {"type": "ephemeral"}}],
        }
        fitted = fit_body(
            ADAPTER, body, 6000, model=CLAUDE, pipeline=("drop_oldest_turns", "drop_recent_turns", "shrink_system")
        )
        block = fitted.body["system"][0]
        assert block["cache_control"] == {"type": "ephemeral"} and "tokens removed" in block["text"]

    def test_two_messages_of_one_role_left_side_by_side_are_joined(self) -> None:
        body = {
            "model": CLAUDE,
            "max_tokens": 500,
            "messages": [
                {"role": "user", "content": "start"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": words(3000)},
                        {"type": "text", "text": "go on"},
                    ],
                },
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "latest"},
            ],
        }
        fitted = fit_body(
            ADAPTER,
            body,
            2500,
            model=CLAUDE,
            pipeline=("drop_old_tool_exchanges",),
            options={"drop_old_tool_exchanges": {"min_history_turns": 0}},
        )
        assert fitted.body["messages"][0] == {
            "role": "user",
            "content": [{"type": "text", "text": "start"}, {"type": "text", "text": "go on"}],
        }
        assert messages_problems(fitted.body) == []

    def test_a_lowered_output_reserve_is_written_to_max_tokens(self) -> None:
        body = {**agent_body(), "max_tokens": 8000}
        fitted = fit_body(
            ADAPTER,
            body,
            10_000,
            model=CLAUDE,
            pipeline=("clamp_max_tokens",),
            options={"clamp_max_tokens": {"floor": 100}},
        )
        assert fitted.body["max_tokens"] < 8000

    def test_the_clamp_keeps_max_tokens_above_the_thinking_budget(self) -> None:
        """Anthropic refuses a `max_tokens` that is not above `thinking.budget_tokens`."""
        thinking = {"type": "enabled", "budget_tokens": 16_000}
        body = {**agent_body(), "max_tokens": 30_000, "thinking": thinking}
        options = {"clamp_max_tokens": {"floor": 100}}
        fitted = fit_body(ADAPTER, body, 21_000, model=CLAUDE, pipeline=("clamp_max_tokens",), options=options)
        assert fitted.plan.result.outcome == "trimmed" and 16_000 < fitted.body["max_tokens"] < 30_000
        assert fitted.body["thinking"] == thinking

    def test_a_clamp_that_would_reach_the_thinking_budget_refuses_in_anthropics_max_tokens_words(self) -> None:
        body = {**agent_body(), "max_tokens": 19_000, "thinking": {"type": "enabled", "budget_tokens": 18_000}}
        options = {"clamp_max_tokens": {"floor": 100}}
        fitted = fit_body(ADAPTER, body, 20_000, model=CLAUDE, pipeline=("clamp_max_tokens",), options=options)
        result = fitted.plan.result
        assert result.outcome == "rejected" and fitted.body["max_tokens"] == 19_000
        message = result.rejection_message(result.anthropic_overflow())
        assert message.startswith(f"input length and `max_tokens` exceed context limit: {result.tokens_after} + ")
        assert "> 19000, decrease input length or `max_tokens` and try again." in message


class TestErrors:
    @pytest.mark.parametrize(
        ("status", "kind"),
        [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (404, "not_found_error"),
            (413, "request_too_large"),
            (502, "api_error"),
        ],
    )
    def test_errors_have_anthropics_shape_and_type(self, status: int, kind: str) -> None:
        assert ADAPTER.error_body(HTTPRefusal("bad", status)) == {
            "type": "error",
            "error": {"type": kind, "message": "bad"},
        }

    def test_the_field_is_named_in_the_message(self) -> None:
        assert (
            ADAPTER.error_body(BadRequest("is required", param="max_tokens"))["error"]["message"]
            == "max_tokens: is required"
        )

    def test_anthropics_overflow_error_is_understood_by_the_self_correction(self) -> None:
        body = b'{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 208310 tokens > 200000 maximum"}}'
        overflow = parse_overflow(400, body)
        assert overflow is not None and (overflow.prompt_tokens, overflow.limit) == (208310, 200000)

    def test_anthropics_max_tokens_overflow_is_understood_too(self) -> None:
        message = (
            "input length and `max_tokens` exceed context limit: 199759 + 8192 > 200000, decrease input length or "
            "`max_tokens` and try again"
        )
        body = json.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": message}})
        overflow = parse_overflow(400, body.encode())
        assert overflow is not None and (overflow.provider, overflow.prompt_tokens, overflow.limit) == (
            "anthropic",
            199759,
            200000,
        )
        assert parse_overflow(400, body.encode(), sent=message.encode()) is None  # an echo of what was sent


class TestMessagesProblems:
    def test_a_conversation_opening_with_the_assistant_is_a_problem(self) -> None:
        assert messages_problems({"messages": [{"role": "assistant", "content": "x"}]})

    def test_a_tool_result_with_no_tool_use_before_it_is_a_problem(self) -> None:
        assert messages_problems(
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]}
        )

    def test_a_tool_use_with_no_result_next_is_a_problem(self) -> None:
        body = {
            "messages": [
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t"}]},
                {"role": "user", "content": "y"},
            ]
        }
        assert messages_problems(body)
