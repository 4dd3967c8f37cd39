"""The history cut of `drop_oldest_turns`: the opening kept before the cut, the turn kept in part
(its images first), and `drop_recent_turns` keeping the opening longest."""

from __future__ import annotations

import json
from typing import Any

from proxy.core.counting.request_count import RequestCounter
from proxy.core.trimming.budget import BudgetPolicy
from proxy.core.trimming.history import IMAGE_MARKER, keep_in_part
from proxy.core.trimming.strategies import DropRecentTurns
from proxy.core.trimming.trim import TrimState
from proxy.core.trimming.turns import validity_problems
from tests.conftest import png_data_url
from tests.support.trimming import WORDS, fit, growing, profile, recount, request, tokenizer, words

PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAgAAAAIACAYAAAD0eNT6AAAAAA=="  # a 512 x 512 header


def state_of(body: dict[str, Any], window: int) -> TrimState:
    counter = RequestCounter(profile(window), tokenizer())
    return TrimState.start(body, counter.request(body), counter, BudgetPolicy(), window)


class TestOpening:
    def test_every_later_request_of_the_conversation_starts_with_the_same_opening(self):
        results = [fit(request(n, answer_tokens=400), 3000).result for n in range(12, 30)]
        openings = {json.dumps(r.body["messages"][: r.insert_at]) for r in results}
        assert len(openings) == 1
        assert all(r.cut is not None and r.cut.head_turns == results[0].cut.head_turns > 0 for r in results)
        assert results[0].body["messages"][1]["content"].startswith("q0 ")

    def test_the_opening_holds_its_share_of_the_budget_its_last_turn_kept_in_part(self):
        result = fit(request(20, answer_tokens=400), 3000).result
        cut = result.cut
        assert cut is not None and cut.head_partial_index is not None
        assert cut.head_tokens == int(0.75 * result.budget.input_budget)
        partial = result.body["messages"][result.insert_at - 1]
        assert partial["role"] == "assistant" and "tokens removed ...]" in partial["content"]
        assert [r.kind for r in result.removals if r.index == cut.head_partial_index] == ["truncated"]
        assert result.fits and recount(result.body, 3000) == result.tokens_after
        assert validity_problems(result.body["messages"]) == []

    def test_the_opening_gives_way_in_tenths_of_the_budget_to_the_turns_the_guarantee_keeps(self):
        messages = growing(30)
        messages[-1]["content"] = "recent " + words(1500)  # the turn the history guarantee keeps
        result = fit({"messages": [*messages, {"role": "user", "content": "newest"}]}, 3000).result
        budget = result.budget.input_budget
        assert result.cut is not None and 0 < result.cut.head_tokens < int(0.75 * budget)
        assert (int(0.75 * budget) - result.cut.head_tokens) >= budget // 10
        assert any("recent " in str(m["content"]) for m in result.body["messages"])

    def test_a_head_share_of_zero_keeps_no_opening(self):
        result = fit(request(30), 3000, options={"drop_oldest_turns": {"head_share": 0}}).result
        assert result.cut is not None and (result.cut.head_turns, result.cut.head_tokens) == (0, 0)
        assert not result.body["messages"][1]["content"].startswith("q0 ")


class TestKeepInPart:
    def test_a_turn_is_shortened_to_its_target_through_its_largest_message(self):
        body = request(3, answer_tokens=500)
        state = state_of(body, 3000)
        turn = state.conversation.turns[0]
        index = keep_in_part(state, turn, 200, 64, "drop_oldest_turns")
        assert index == 2 and sum(state.counts[i] for i in turn.indices) <= 200
        assert "tokens removed ...]" in state.messages[2]["content"]

    def test_images_go_first_when_the_text_alone_cannot_make_the_room(self):
        image = {"type": "image_url", "image_url": {"url": PNG}}
        body = {
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "see " + words(100)}, image]},
                {"role": "assistant", "content": "a picture " + words(100)},
                {"role": "user", "content": "newest"},
            ]
        }
        state = state_of(body, 3000)
        turn = state.conversation.turns[0]
        before = sum(state.counts[i] for i in turn.indices)
        index = keep_in_part(state, turn, before - 300, 64, "drop_oldest_turns")
        assert index is not None and sum(state.counts[i] for i in turn.indices) <= before - 300
        assert {"type": "text", "text": IMAGE_MARKER} in state.messages[0]["content"]
        assert [r.kind for r in state.removals if r.index == 0] == ["image_dropped"]

    def test_a_turn_that_would_keep_less_than_the_minimum_is_left_alone(self):
        state = state_of(request(3, answer_tokens=100), 3000)
        turn = state.conversation.turns[0]
        assert keep_in_part(state, turn, 20, 64, "drop_oldest_turns") is None
        assert state.removals == []

    def test_a_turn_its_shortening_cannot_bring_to_the_target_is_left_as_it_was(self):
        """Found by the property that appending a turn never moves the cut back: an attempt that
        dropped an image and cut a text, then fell a few tokens short, left them changed."""
        calls = [
            {"id": f"c{i}", "type": "function", "function": {"name": "search", "arguments": "{}"}} for i in range(3)
        ]
        image = {"type": "image_url", "image_url": {"url": png_data_url(1024, 768)}}
        messages = [
            {"role": "user", "content": "alpha"},
            {"role": "user", "content": [{"type": "text", "text": "alpha"}, image]},
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": "c0", "content": " ".join(WORDS[i % len(WORDS)] for i in range(500))},
            {"role": "tool", "tool_call_id": "c1", "content": "alpha"},
            {"role": "tool", "tool_call_id": "c2", "content": "alpha"},
            {"role": "user", "content": "next"},
        ]
        reached = fell_short = 0
        for target in range(500, 900, 13):
            state = state_of({"messages": messages}, 1500)
            turn = state.conversation.turns[1]
            before = (list(state.messages), list(state.counts), state.total)
            if keep_in_part(state, turn, target, 64, "drop_oldest_turns") is None:
                fell_short += 1
                assert (state.messages, state.counts, state.total, state.removals) == (*before, [])
            else:
                reached += 1
                assert sum(state.counts[i] for i in turn.indices) <= target
        assert reached and fell_short  # both kinds of attempt were made


class TestDropRecentTurns:
    def test_the_last_turn_to_go_is_kept_in_part(self):
        messages = growing(3, 450)
        body = {"messages": [*messages, {"role": "user", "content": "newest " + words(1500)}]}
        result = fit(body, 3000, pipeline=("drop_recent_turns",)).result
        kinds = {r.index: r.kind for r in result.removals}
        assert result.fits and kinds[1] == kinds[2] == "dropped"
        assert "truncated" in {kinds.get(3), kinds.get(4)} and 5 not in kinds and 6 not in kinds
        assert validity_problems(result.body["messages"]) == []

    def test_the_opening_goes_after_the_turns_that_follow_it(self):
        body = {"messages": [*growing(4, 100), {"role": "user", "content": "newest " + words(2200)}]}
        state = state_of(body, 3000)
        state.opening_end = state.conversation.turns[0].indices[-1]  # as drop_oldest_turns leaves it
        DropRecentTurns()(state)
        dropped = {r.index for r in state.removals if r.kind == "dropped"}
        assert state.over() <= 0 and 1 not in dropped and 2 not in dropped
        assert {3, 4, 5, 6} <= dropped
