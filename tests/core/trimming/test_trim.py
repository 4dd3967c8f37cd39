"""Fitting a request to its budget: what is cut, in what order, and what is never touched."""

from __future__ import annotations

import pytest

from proxy.core.trimming.history import IMAGE_MARKER
from proxy.core.trimming.strategies import build_pipeline
from proxy.core.trimming.turns import validity_problems
from tests.conftest import png_data_url
from tests.support.trimming import call, fit, words


def chat(turns: int, tokens_per_message: int = 100) -> list[dict]:
    messages: list[dict] = [{"role": "system", "content": "You are helpful."}]
    for i in range(turns):
        messages += [
            {"role": "user", "content": f"q{i} " + words(tokens_per_message)},
            {"role": "assistant", "content": f"a{i} " + words(tokens_per_message, "ipsum")},
        ]
    return [*messages, {"role": "user", "content": "latest question"}]


class TestRequestsThatFit:
    def test_come_back_as_the_same_object(self):
        body = {"model": "gpt-4o", "messages": chat(2)}
        plan = fit(body, 128000)
        assert plan.result.body is body and plan.result.outcome == "unchanged" and not plan.result.removals


NO_OPENING = {"drop_oldest_turns": {"head_share": 0}}


class TestDropOldestTurns:
    def test_without_an_opening_drops_whole_turns_oldest_first_until_it_fits(self):
        body = {"messages": chat(30), "temperature": 0.2, "x-vendor": {"keep": True}}
        result = fit(body, 3000, options=NO_OPENING).result
        assert result.outcome == "trimmed" and result.fits
        kept = result.body["messages"]
        assert kept[0]["role"] == "system" and kept[1]["role"] == "user" and kept[-1]["content"] == "latest question"
        dropped = [r.index for r in result.removals]
        assert dropped == list(range(1, 1 + len(dropped)))  # the oldest, contiguous
        assert len(dropped) % 2 == 0  # whole turns
        assert {k: v for k, v in result.body.items() if k != "messages"} == {
            "temperature": 0.2,
            "x-vendor": {"keep": True},
        }

    def test_never_splits_a_tool_call_from_its_results(self):
        messages = [{"role": "system", "content": "s"}]
        for i in range(20):
            messages += [
                {"role": "user", "content": words(50)},
                call(f"a{i}", f"b{i}"),
                {"role": "tool", "tool_call_id": f"a{i}", "content": words(80)},
                {"role": "tool", "tool_call_id": f"b{i}", "content": words(80)},
                {"role": "assistant", "content": words(40)},
            ]
        messages.append({"role": "user", "content": "go on"})
        result = fit({"messages": messages}, 2500).result
        assert result.fits and validity_problems(result.body["messages"]) == []

    def test_keeps_the_history_guarantee_in_part_when_it_alone_overflows(self):
        messages = chat(6, 50)
        messages[-2]["content"] = "recent answer " + words(3000)  # the most recent history turn is huge
        result = fit({"messages": messages}, 3000, options={"drop_oldest_turns": {"min_history_turns": 1}}).result
        kept = [m["content"][:13] for m in result.body["messages"]]
        assert result.fits and "recent answer" in kept  # kept, but shortened
        answer = len(messages) - 2
        assert [r.kind for r in result.removals if r.index == answer] == ["truncated"]

    def test_records_each_removal_with_index_role_tokens_and_hash(self):
        result = fit({"messages": chat(20)}, 2500, options=NO_OPENING).result
        first = result.removals[0]
        assert (first.index, first.role, first.kind, first.strategy) == (1, "user", "dropped", "drop_oldest_turns")
        assert first.tokens > 100 and len(first.hash) == 12
        assert result.tokens_before - result.tokens_after == sum(r.tokens for r in result.removals)


class TestDropOldToolExchanges:
    def test_drops_old_tool_exchanges_before_any_question_or_answer(self):
        messages = [{"role": "system", "content": "s"}]
        for i in range(6):
            messages += [
                {"role": "user", "content": f"question {i}"},
                call(f"c{i}"),
                {"role": "tool", "tool_call_id": f"c{i}", "content": words(900)},
                {"role": "assistant", "content": f"answer {i}"},
            ]
        messages.append({"role": "user", "content": "and now?"})
        result = fit({"messages": messages}, 5000, pipeline=("drop_old_tool_exchanges", "drop_oldest_turns")).result
        assert result.fits and validity_problems(result.body["messages"]) == []
        assert {r.role for r in result.removals} == {"assistant", "tool"}  # only calls and their results
        kept = [m.get("content") for m in result.body["messages"]]
        assert all(f"question {i}" in kept and f"answer {i}" in kept for i in range(6))


class TestShrinkToolResults:
    def test_cuts_oversized_results_middle_out_with_a_factual_marker(self):
        messages = [
            {"role": "user", "content": "fetch"},
            call("c1"),
            {"role": "tool", "tool_call_id": "c1", "content": "HEAD " + words(6000) + " TAIL"},
        ]
        result = fit({"messages": messages}, 4000, options={"shrink_tool_results": {"cap": 1000}}).result
        content = result.body["messages"][2]["content"]
        assert result.fits and content.startswith("HEAD ") and content.endswith(" TAIL")
        assert "tokens removed ...]" in content
        assert result.removals[0].kind == "truncated" and result.removals[0].role == "tool"

    def test_shrinks_text_parts_inside_content_arrays(self):
        long_part = {"type": "text", "text": words(6000)}
        messages = [
            {"role": "user", "content": "go"},
            call("c1"),
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "short"}, long_part]},
        ]
        result = fit({"messages": messages}, 4000).result
        parts = result.body["messages"][2]["content"]
        assert result.fits and parts[0] == {"type": "text", "text": "short"} and "tokens removed" in parts[1]["text"]


class TestDropImages:
    def test_replaces_the_oldest_images_before_any_turn_is_dropped(self):
        image = {"type": "image_url", "image_url": {"url": png_data_url(2048, 2048)}}
        messages = [
            {"role": "user", "content": [{"type": "text", "text": "look"}, image]},
            {"role": "assistant", "content": "nice"},
            {"role": "user", "content": [{"type": "text", "text": "and now"}, image]},
        ]
        pipeline = ("drop_images", "drop_oldest_turns")
        result = fit({"messages": messages}, 2000, pipeline=pipeline).result
        assert result.fits and [r.kind for r in result.removals] == ["image_dropped"]
        assert result.body["messages"][0]["content"][1] == {"type": "text", "text": IMAGE_MARKER}
        assert result.body["messages"][2]["content"][1] == image  # the latest user message keeps its image


class TestClampMaxTokens:
    def test_lowers_max_tokens_instead_of_cutting_history_when_configured(self):
        body = {"messages": chat(3, 200), "max_tokens": 4000}
        result = fit(
            body, 5000, pipeline=("clamp_max_tokens", "drop_oldest_turns"), options={"clamp_max_tokens": {"floor": 500}}
        ).result
        assert (
            result.fits
            and 500 <= result.body["max_tokens"] < 4000
            and len(result.body["messages"]) == len(body["messages"])
        )
        assert result.removals[0].kind == "max_tokens_clamped" and result.removals[0].index is None

    def test_never_goes_below_the_floor(self):
        body = {"messages": chat(3, 200), "max_completion_tokens": 3000}
        result = fit(body, 2000, pipeline=("clamp_max_tokens",), options={"clamp_max_tokens": {"floor": 1000}}).result
        assert result.outcome == "rejected" and result.budget.output_reserve == 1000


class TestLastResort:
    def test_the_latest_user_message_is_cut_only_after_everything_else(self):
        messages = [
            {"role": "system", "content": "rules"},
            {"role": "user", "content": "old"},
            {"role": "assistant", "content": "reply"},
            {"role": "user", "content": "BEGIN " + words(8000) + " END"},
        ]
        result = fit({"messages": messages}, 4000).result
        assert result.fits
        assert [r.strategy for r in result.removals] == ["drop_recent_turns", "drop_recent_turns", "shrink_latest_user"]
        latest = result.body["messages"][-1]["content"]
        assert latest.startswith("BEGIN") and latest.endswith("END")

    def test_the_system_prompt_is_never_cut_unless_configured(self):
        messages = [{"role": "system", "content": words(8000)}, {"role": "user", "content": "hi"}]
        assert fit({"messages": messages}, 4000).result.outcome == "rejected"
        allowed = fit({"messages": messages}, 4000, pipeline=("drop_oldest_turns", "shrink_system")).result
        assert allowed.fits and allowed.removals[0].role == "system"


class TestOverflowPolicy:
    def test_reject_returns_the_original_body_and_a_message_with_the_numbers(self):
        body = {"messages": [{"role": "system", "content": words(8000)}, {"role": "user", "content": "hi"}]}
        result = fit(body, 4000).result
        assert result.outcome == "rejected" and result.body is body
        message = result.rejection_message()
        assert (
            f"{result.tokens_before:,}" in message
            and "input budget is 3,200" in message
            and "context window 4,000" in message
        )

    def test_forward_sends_it_unchanged(self):
        body = {"messages": [{"role": "system", "content": words(8000)}, {"role": "user", "content": "hi"}]}
        result = fit(body, 4000, overflow="forward").result
        assert result.outcome == "forwarded_over_budget" and result.body is body


class TestFieldsAreKept:
    def test_reasoning_content_and_unknown_fields_on_kept_messages_are_untouched(self):
        messages = chat(20)
        messages[-2]["reasoning_content"] = "thinking..."
        messages[-2]["vendor_field"] = {"a": [1, 2]}
        result = fit({"messages": messages}, 2500).result
        kept = result.body["messages"][-2]
        assert kept["reasoning_content"] == "thinking..." and kept["vendor_field"] == {"a": [1, 2]}
        assert kept is messages[-2]


class TestDeterminism:
    def test_the_same_input_gives_the_same_output(self):
        body = {"messages": chat(25)}
        assert fit(body, 3000).result.body == fit(body, 3000).result.body


class TestRegistry:
    def test_an_unknown_strategy_name_lists_the_known_ones(self):
        with pytest.raises(
            ValueError, match="unknown strategy 'drop_everything'; known: drop_images, clamp_max_tokens"
        ):
            build_pipeline(["drop_everything"])

    def test_a_bad_option_names_the_strategy(self):
        with pytest.raises(ValueError, match="strategy 'shrink_tool_results'"):
            build_pipeline(["shrink_tool_results"], {"shrink_tool_results": {"bogus": 1}})


class TestRejectionMessage:
    def test_it_states_the_numbers_plainly(self, counter_for):
        from proxy.core.plan import TrimPolicy, plan_request
        from proxy.core.trimming.budget import BudgetPolicy

        counter = counter_for("gpt-4")
        body = {
            "model": "gpt-4",
            "messages": [{"role": "system", "content": "rule " * 9000}, {"role": "user", "content": "hi"}],
        }
        result = plan_request(body, counter, TrimPolicy(budget=BudgetPolicy())).result
        message = result.rejection_message()
        assert message.startswith(f"This request has {result.tokens_before:,} input tokens; after every cut")
        assert "input budget is 6,554 tokens" in message

    def test_a_window_with_no_room_for_input_says_so(self, counter_for):
        from proxy.core.plan import TrimPolicy, plan_request

        counter = counter_for("gpt-4")
        body = {"model": "gpt-4", "max_tokens": 9000, "messages": [{"role": "user", "content": "Say hi."}]}
        result = plan_request(body, counter, TrimPolicy()).result
        assert result.outcome == "rejected"
        assert (
            "leaves no room for input" in result.rejection_message() and "budget is -" not in result.rejection_message()
        )


class TestRejectionWording:
    """The refusal opens with the provider's own overflow sentence, which client libraries match."""

    def _rejected(self, counter_for, **body_fields):
        from proxy.core.plan import TrimPolicy, plan_request
        from proxy.core.trimming.budget import BudgetPolicy

        counter = counter_for("gpt-4")
        messages = [{"role": "system", "content": "rule " * 9000}, {"role": "user", "content": "hi"}]
        body = {"model": "gpt-4", "messages": messages, **body_fields}
        return plan_request(body, counter, TrimPolicy(budget=BudgetPolicy())).result

    def test_openai_wording_states_the_window_and_the_messages_tokens(self, counter_for):
        result = self._rejected(counter_for)
        message = result.rejection_message(result.openai_overflow())
        assert message.startswith(
            f"This model's maximum context length is 8192 tokens. However, your messages resulted in "
            f"{result.tokens_after} tokens. Please reduce the length of the messages. (context-guard, "
            f"context_length_exceeded) This request has"
        )
        assert "input budget is 6,554 tokens" in message

    def test_a_prompt_inside_the_window_is_worded_with_the_completion_it_asks_for(self, counter_for):
        from proxy.core.plan import TrimPolicy, plan_request
        from proxy.core.trimming.budget import BudgetPolicy

        counter = counter_for("gpt-4")
        messages = [{"role": "system", "content": "rule " * 7000}, {"role": "user", "content": "hi"}]
        body = {"model": "gpt-4", "max_tokens": 2000, "messages": messages}
        result = plan_request(body, counter, TrimPolicy(budget=BudgetPolicy())).result
        assert result.outcome == "rejected" and result.tokens_after < 8192
        assert result.rejection_message(result.openai_overflow()).startswith(
            f"This model's maximum context length is 8192 tokens. However, you requested "
            f"{result.tokens_after + 2000} tokens ({result.tokens_after} in the messages, 2000 in the completion)."
        )

    def test_anthropic_wording_for_an_input_that_fits_without_its_max_tokens_is_anthropics_max_tokens_sentence(
        self, counter_for
    ):
        """Claude Code reads `X + Y > W` from it and retries with `max_tokens` W - X - 1000."""
        from proxy.core.plan import TrimPolicy, plan_request
        from proxy.core.trimming.budget import BudgetPolicy

        counter = counter_for("gpt-4")
        messages = [{"role": "system", "content": "rule " * 6000}, {"role": "user", "content": "hi"}]
        body = {"model": "gpt-4", "max_tokens": 2000, "messages": messages}
        result = plan_request(body, counter, TrimPolicy(budget=BudgetPolicy())).result
        limit = 8192 - 410  # the window less the guard's safety margin
        assert result.outcome == "rejected" and result.tokens_after < limit < result.tokens_after + 2000
        assert result.rejection_message(result.anthropic_overflow()).startswith(
            f"input length and `max_tokens` exceed context limit: {result.tokens_after} + 2000 > {limit}, "
            "decrease input length or `max_tokens` and try again."
        )
        retried = {**body, "max_tokens": limit - result.tokens_after - 1000}
        again = plan_request(retried, counter, TrimPolicy(budget=BudgetPolicy())).result
        assert again.outcome == "unchanged"

    def test_anthropic_wording_says_the_prompt_is_too_long_against_its_budget(self, counter_for):
        result = self._rejected(counter_for)
        message = result.rejection_message(result.anthropic_overflow())
        assert message.startswith(f"prompt is too long: {result.tokens_after} tokens > 6554 maximum.")
        assert "context window 8,192" in message
