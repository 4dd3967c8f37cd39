"""Trimming a conversation that is re-sent turn after turn: cache-stable cuts, the low-water band,
the partial turn, the budget note, and each removed message reported once."""

from __future__ import annotations

import json
import subprocess
import sys
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from proxy.core.trimming.strategies import build_pipeline
from proxy.core.trimming.turns import validity_problems
from tests.support.trimming import call, fit, growing, recount, request, words

ROOT = Path(__file__).parents[3]


# The cut-position mechanics on their own: no opening kept before the cut.
NO_OPENING = {"drop_oldest_turns": {"head_share": 0}}


class TestCacheStableCuts:
    def test_the_same_history_plus_one_turn_keeps_the_forwarded_prefix_until_the_cut_moves(self):
        results = [fit(request(n), 3000).result for n in range(16, 44)]
        kept_prefix = 0
        for before, after in pairwise(results):
            assert before.cut is not None and after.cut is not None and after.cut.position >= before.cut.position
            if after.cut.position == before.cut.position:
                old, new = before.body["messages"], after.body["messages"]
                assert new[: len(old) - 1] == old[:-1]  # all but the newest question, then its answer
                kept_prefix += 1
        assert kept_prefix >= len(results) // 2

    def test_two_fresh_processes_pick_the_same_opening_and_cut(self):
        script = (
            "import json, sys; from tests.support.trimming import fit, request;"
            "r = fit(request(int(sys.argv[1]), answer_tokens=400), 3000).result;"
            "print(json.dumps([r.cut.to_dict(), r.body['messages']], sort_keys=True))"
        )
        outputs = {
            subprocess.run(
                [sys.executable, "-c", script, "22"], capture_output=True, text=True, check=True, cwd=ROOT
            ).stdout
            for _ in range(2)
        }
        here = fit(request(22, answer_tokens=400), 3000).result
        assert here.cut is not None and here.cut.head_partial_index is not None
        assert outputs == {json.dumps([here.cut.to_dict(), here.body["messages"]], sort_keys=True) + "\n"}

    @pytest.mark.parametrize("low_water", [0.5, 0.7, 0.9])
    def test_a_cut_request_keeps_its_history_between_the_low_water_mark_and_its_budget(self, low_water):
        options = {"drop_oldest_turns": {"low_water": low_water, "head_share": 0}}
        for n in range(16, 34):
            result = fit(request(n), 3000, options=options).result
            budget = result.budget.input_budget
            step = int((1 - low_water) * budget)
            assert result.cut is not None and result.cut.reason == "low_water" and result.cut.step == step
            largest_turn = 180  # a question and an answer of these sizes
            assert budget - step - largest_turn <= result.tokens_after <= budget

    def test_a_low_water_mark_of_one_cuts_no_deeper_than_needed(self):
        options = {"drop_oldest_turns": {"low_water": 1.0, "head_share": 0}}
        result = fit(request(30, answer_tokens=400), 3000, options=options).result
        assert result.cut is not None and result.cut.reason == "minimal"
        assert result.tokens_after >= result.budget.input_budget - 64  # the partial turn fills the rest

    def test_a_cut_inside_the_oldest_guaranteed_turn_keeps_it_in_part_on_its_position(self):
        messages = growing(6, 50)
        messages[-1]["content"] = "recent " + words(2500)
        body = {"messages": [*messages, {"role": "user", "content": "newest"}]}
        result = fit(body, 3000, options={"drop_oldest_turns": {"min_history_turns": 1}}).result
        assert result.fits and result.cut is not None and result.cut.reason == "low_water"
        assert result.cut.partial_index == len(messages) - 1 and result.cut.position % result.cut.step == 0
        assert validity_problems(result.body["messages"]) == []

    def test_a_cut_past_the_oldest_guaranteed_turn_falls_back_to_dropping_turn_by_turn(self):
        messages = growing(8, 50)
        messages[-3]["content"] = "recent " + words(300)
        messages[-1]["content"] = "recent " + words(2500)  # the newest turn alone is over the room
        body = {"messages": [*messages, {"role": "user", "content": "newest"}]}
        options = {"drop_oldest_turns": {"min_history_turns": 2, "head_share": 0}}
        result = fit(body, 3000, options=options).result
        assert result.fits and result.cut is not None and result.cut.reason == "minimal"
        assert validity_problems(result.body["messages"]) == []

    def test_a_head_share_keeps_the_opening_turns_and_cuts_after_them(self):
        options = {"drop_oldest_turns": {"head_share": 0.3, "keep_partial": False}}
        results = [fit(request(n), 3000, options=options).result for n in (30, 31, 40)]
        for result in results:
            kept = [m["content"][:3] for m in result.body["messages"][1:5]]
            assert kept == ["q0 ", "a0 ", "q1 ", "a1 "] and result.fits
            assert not any(r.index is not None and r.index <= 4 for r in result.removals)
        assert results[2].cut is not None and results[2].cut.first_kept is not None

    @pytest.mark.parametrize(
        "options, message",
        [
            ({"low_water": 0}, "low_water must be between 0.1 and 1"),
            ({"low_water": 1.5}, "low_water must be between 0.1 and 1"),
            ({"low_water": "high"}, "low_water must be a number"),
            ({"keep_partial": "yes"}, "keep_partial must be true or false"),
            ({"head_share": 0.9}, "head_share must be between 0 and 0.8"),
            ({"min_history_turns": -1}, "min_history_turns must be a whole number of at least 0"),
        ],
    )
    def test_bad_options_are_refused_naming_the_strategy_and_option(self, options, message):
        with pytest.raises(ValueError, match=f"drop_oldest_turns: {message}"):
            build_pipeline(["drop_oldest_turns"], {"drop_oldest_turns": options})


@pytest.fixture(scope="module")
def cuts() -> list[Any]:
    """Successive requests of a chat with long answers, each cut to a 4,000-token window."""
    options = {"drop_oldest_turns": {"head_share": 0, "low_water": 0.6}}
    return [fit(request(n, answer_tokens=600), 4000, options=options).result for n in range(8, 24)]


class TestPartialTurn:
    def test_the_turn_across_the_cut_is_kept_in_part_valid_marked_and_recounted(self, cuts):
        with_partial = [r for r in cuts if r.cut is not None and r.cut.partial_index is not None]
        assert len(with_partial) >= len(cuts) // 3
        for result in with_partial:
            index = result.cut.partial_index
            assert result.cut.partial_tokens >= 64
            assert [r.kind for r in result.removals if r.index == index] == ["truncated"]
            partial = next(m for m in result.body["messages"] if "tokens removed ...]" in str(m.get("content")))
            assert partial["role"] == "assistant" and validity_problems(result.body["messages"]) == []
            assert recount(result.body, 4000) == result.tokens_after

    def test_the_partial_turn_is_the_same_on_the_next_turn(self, cuts):
        pairs = [
            (a, b)
            for a, b in pairwise(cuts)
            if a.cut and b.cut and a.cut.partial_index is not None and a.cut.position == b.cut.position
        ]
        assert pairs
        for first, second in pairs:
            assert second.body["messages"][: len(first.body["messages"]) - 1] == first.body["messages"][:-1]

    def test_turned_off_the_turn_across_the_cut_goes_whole(self):
        options = {"drop_oldest_turns": {"keep_partial": False, "head_share": 0}}
        result = fit(request(14, answer_tokens=600), 4000, options=options).result
        assert result.cut is not None and result.cut.partial_index is None
        assert all(r.kind == "dropped" for r in result.removals)


class TestEachRemovalReportedOnce:
    def test_a_message_shortened_and_then_dropped_is_reported_once_as_dropped(self):
        body = {
            "messages": [
                {"role": "system", "content": "rules"},
                {"role": "user", "content": "old question"},
                {"role": "assistant", "content": "long answer " + words(3000)},
                {"role": "user", "content": "newest " + words(3000)},
            ]
        }
        result = fit(body, 3000).result
        indices = [r.index for r in result.removals]
        assert result.fits and len(indices) == len(set(indices))
        answer = next(r for r in result.removals if r.index == 2)
        assert answer.kind == "dropped" and answer.tokens > 3000
        assert result.tokens_before - result.tokens_after == sum(r.tokens for r in result.removals)


class TestBudgetNote:
    def test_the_note_says_how_many_messages_and_tokens_were_removed_and_is_counted(self):
        options = {"drop_oldest_turns": {"head_share": 0, "keep_partial": False}}
        result = fit(request(30), 3000, note=True, options=options).result
        note = result.body["messages"][1]
        dropped = [r for r in result.removals if r.kind == "dropped"]
        expected = f"{len(dropped)} earlier messages, {sum(r.tokens for r in dropped):,} tokens, were removed"
        assert note["role"] == "system" and note["content"].startswith(expected)
        assert result.fits and result.note_tokens > 0 and recount(result.body, 3000) == result.tokens_after
        assert result.inserted == (1,)  # for adapters that write the cut back into another API's shape

    def test_the_note_goes_where_the_dropped_history_was_after_the_opening(self):
        result = fit(request(30), 3000, note=True).result
        messages = result.body["messages"]
        assert result.cut is not None and result.cut.head_turns > 0
        (at,) = result.inserted
        assert messages[at]["role"] == "system" and "to fit the context window." in messages[at]["content"]
        assert messages[at - 1] is not None and messages[at - 1]["role"] == "assistant"  # the opening's last answer
        without = fit(request(30), 3000).result
        assert messages[:at] == without.body["messages"][:at]  # the prefix is the one without the note

    def test_there_is_no_note_unless_asked_for(self):
        result = fit(request(30), 3000).result
        assert result.note_tokens == 0 and all(m["role"] != "system" for m in result.body["messages"][1:])

    def test_a_request_that_fits_gets_no_note(self):
        body = request(2)
        assert fit(body, 128000, note=True).result.body is body


class TestCapsScaleWithTheBudget:
    def test_on_a_small_window_an_old_tool_result_is_shortened_rather_than_the_recent_turn_dropped(self):
        body = {
            "messages": [
                {"role": "user", "content": "look it up"},
                call("c1"),
                {"role": "tool", "tool_call_id": "c1", "content": "HEAD " + words(1500) + " TAIL"},
                {"role": "assistant", "content": "found it"},
                {"role": "user", "content": "and then?"},
            ]
        }
        result = fit(body, 2048).result
        assert result.fits and len(result.body["messages"]) == 5
        assert [(r.index, r.kind) for r in result.removals] == [(2, "truncated")]
        assert "HEAD" in result.body["messages"][2]["content"] and "TAIL" in result.body["messages"][2]["content"]
