"""Anthropic's context edits: read from the body, applied as the provider applies them, counted
after them, and what they cleared written into the answer where Anthropic puts it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.apis.anthropic.applied_edits import StreamedAnswer, WholeAnswer
from proxy.apis.anthropic.context_edits import (
    CLEARED,
    ClearThinking,
    ClearToolUses,
    TokenSizes,
    apply_edits,
    requested_edits,
    without_beta,
    without_edits,
)
from proxy.apis.anthropic.messages import CountTokensAdapter, MessagesAdapter
from proxy.apis.base import InvalidRequest
from proxy.apis.fitting import Counting, Fitted, fit
from proxy.core.plan import TrimPolicy
from tests.apis.fitting import words
from tests.support.cookbook import cookbook_count
from tests.support.trimming import profile, tokenizer
from tests.support.validity import messages_problems

CLAUDE = "claude-sonnet-4-5"
CLAUDE_CODE = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}  # sent on every request, 2.1.x
READ = {"name": "read", "description": "Read a file", "input_schema": {"type": "object"}}


def words_of(text: str) -> int:
    """A stand-in tokenizer for the pure functions: one token a word."""
    return len(text.split())


sizes = TokenSizes(words_of, words_of)


def tool_loop(results: int, words_each: int, management: Any = None, name: str = "read") -> dict[str, Any]:
    """A Messages body of `results` tool calls, each answered with `words_each` words."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Survey the repository."}]
    for k in range(results):
        use = {"type": "tool_use", "id": f"toolu_{k}", "name": name, "input": {"path": f"src/module_{k}.py"}}
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"Reading {k}."}, use]})
        result = {"type": "tool_result", "tool_use_id": f"toolu_{k}", "content": f"file {k}: " + words(words_each)}
        messages.append({"role": "user", "content": [result]})
    body: dict[str, Any] = {"model": CLAUDE, "max_tokens": 1024, "messages": messages, "tools": [READ]}
    if management is not None:
        body["context_management"] = management
    return body


def clear_tool_uses(**fields: Any) -> dict[str, Any]:
    return {"edits": [{"type": "clear_tool_uses_20250919", **fields}]}


def results_of(body: dict[str, Any]) -> list[Any]:
    return [b["content"] for m in body["messages"] if m["role"] == "user" and isinstance(m["content"], list)
            for b in m["content"] if b["type"] == "tool_result"]  # fmt: skip


def thinking_turns(turns: int) -> list[dict[str, Any]]:
    """`turns` user questions, each answered after a tool call, with thinking before each answer."""
    messages: list[dict[str, Any]] = []
    for k in range(turns):
        thought = {"type": "thinking", "thinking": f"plan {k} " + words(50), "signature": f"sig-{k}"}
        use = {"type": "tool_use", "id": f"toolu_{k}", "name": "read", "input": {}}
        messages += [
            {"role": "user", "content": f"Question {k}"},
            {"role": "assistant", "content": [thought, use]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"toolu_{k}", "content": "ok"}]},
            {"role": "assistant", "content": [{**thought, "signature": f"sig-{k}b"}, {"type": "text", "text": "done"}]},
        ]
    return messages


class TestRequestedEdits:
    def test_a_bare_clear_tool_uses_takes_anthropics_defaults(self) -> None:
        """Trigger at 100,000 input tokens, keep 3 tool uses, nothing excluded, inputs kept."""
        (edit,) = requested_edits({"context_management": clear_tool_uses()})
        assert edit == ClearToolUses(100_000, None, 3, 0, frozenset(), False)

    def test_claude_codes_keep_all_thinking_edit_is_read_as_clearing_nothing(self) -> None:
        assert requested_edits({"context_management": CLAUDE_CODE}) == (ClearThinking(None),)

    def test_a_bare_clear_thinking_keeps_the_last_turn(self) -> None:
        assert requested_edits({"context_management": {"edits": [{"type": "clear_thinking_20251015"}]}}) == (
            ClearThinking(1),
        )

    def test_a_tool_uses_trigger_and_named_inputs_are_read(self) -> None:
        management = clear_tool_uses(
            trigger={"type": "tool_uses", "value": 5}, clear_tool_inputs=["bash"], exclude_tools=["memory"]
        )
        (edit,) = requested_edits({"context_management": management})
        assert edit == ClearToolUses(None, 5, 3, 0, frozenset({"memory"}), frozenset({"bash"}))

    def test_other_kinds_of_edit_are_not_this_modules(self) -> None:
        management = {"edits": [{"type": "compact_20260112"}, {"type": "clear_thinking_20251015", "keep": "all"}]}
        assert requested_edits({"context_management": management}) == (ClearThinking(None),)

    @pytest.mark.parametrize(
        ("management", "param"),
        [
            ("all", "context_management"),
            ({"edits": {}}, "context_management.edits"),
            ({"edits": [{"keep": "all"}]}, "context_management.edits.0"),
            (clear_tool_uses(trigger={"type": "seconds", "value": 1}), "context_management.edits.0.trigger"),
            (clear_tool_uses(keep={"type": "tool_uses", "value": -1}), "context_management.edits.0.keep.value"),
            (clear_tool_uses(exclude_tools="bash"), "context_management.edits.0.exclude_tools"),
            (
                {"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 0}}]},
                "context_management.edits.0.keep.value",
            ),
        ],
    )
    def test_a_malformed_edit_is_refused_naming_its_field(self, management: Any, param: str) -> None:
        with pytest.raises(InvalidRequest) as refused:
            MessagesAdapter().parse(tool_loop(1, 5, management))
        assert refused.value.param == param


class TestClearToolUses:
    def test_under_the_trigger_nothing_is_cleared_and_the_body_is_the_one_given(self) -> None:
        body = tool_loop(6, 100, clear_tool_uses())
        edited = apply_edits(body, requested_edits(body), lambda: 99_999, sizes)
        assert edited.body is body and edited.applied == ()

    def test_over_the_trigger_every_result_but_the_newest_kept_ones_is_replaced(self) -> None:
        body = tool_loop(24, 100, clear_tool_uses(trigger={"type": "input_tokens", "value": 1000}))
        edited = apply_edits(body, requested_edits(body), lambda: 3000, sizes)
        contents = results_of(dict(edited.body))
        assert contents[:21] == [CLEARED] * 21 and contents[21:] == results_of(body)[21:]
        assert edited.applied == (
            {"type": "clear_tool_uses_20250919", "cleared_tool_uses": 21, "cleared_input_tokens": 21 * (102 - words_of(CLEARED))},
        )
        assert results_of(body)[0] != CLEARED  # the body given is left as it was

    def test_a_tool_uses_trigger_counts_the_calls_and_needs_no_count(self) -> None:
        body = tool_loop(6, 10, clear_tool_uses(trigger={"type": "tool_uses", "value": 5}, keep={"type": "tool_uses", "value": 2}))

        def never() -> int:
            raise AssertionError("a tool_uses trigger needs no token count")

        assert results_of(dict(apply_edits(body, requested_edits(body), never, sizes).body)).count(CLEARED) == 4

    def test_an_excluded_tools_results_stay_and_do_not_count_towards_keep(self) -> None:
        body = tool_loop(5, 50, clear_tool_uses(trigger={"type": "input_tokens", "value": 0}, exclude_tools=["memory"]))
        body["messages"][1]["content"][1]["name"] = "memory"  # the oldest call
        contents = results_of(dict(apply_edits(body, requested_edits(body), lambda: 1, sizes).body))
        assert contents[0] != CLEARED and contents[1] == CLEARED and CLEARED not in contents[2:]

    @pytest.mark.parametrize(("inputs", "emptied"), [(True, 3), (["read"], 3), (["bash"], 0), (False, 0)])
    def test_clear_tool_inputs_empties_the_cleared_calls_inputs(self, inputs: Any, emptied: int) -> None:
        management = clear_tool_uses(trigger={"type": "input_tokens", "value": 0}, clear_tool_inputs=inputs)
        body = tool_loop(6, 20, management)
        edited = apply_edits(body, requested_edits(body), lambda: 1, sizes)
        calls = [b for m in edited.body["messages"] if m["role"] == "assistant" for b in m["content"] if b["type"] == "tool_use"]
        assert sum(call["input"] == {} for call in calls) == emptied

    def test_nothing_is_cleared_unless_clear_at_least_can_be(self) -> None:
        at_least = {"type": "input_tokens", "value": 10_000}
        body = tool_loop(6, 100, clear_tool_uses(trigger={"type": "input_tokens", "value": 0}, clear_at_least=at_least))
        assert apply_edits(body, requested_edits(body), lambda: 1, sizes).applied == ()

    def test_the_trigger_is_compared_after_the_thinking_cleared_before_it(self) -> None:
        """clear_thinking runs first: what it freed no longer counts towards the tool trigger."""
        body = {"model": CLAUDE, "max_tokens": 64, "messages": thinking_turns(6)}
        edits = (ClearThinking(1), ClearToolUses(1000, None, 0, 0, frozenset(), False))
        edited = apply_edits(body, edits, lambda: 1200, sizes)
        assert [e["type"] for e in edited.applied] == ["clear_thinking_20251015"]


class TestClearThinking:
    def test_the_thinking_of_all_but_the_last_turns_is_removed(self) -> None:
        """A tool loop's assistant messages are one turn: its thinking goes or stays together."""
        body = {"model": CLAUDE, "max_tokens": 64, "messages": thinking_turns(4)}
        management = {"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 2}}]}
        edited = apply_edits({**body, "context_management": management}, requested_edits({"context_management": management}), lambda: 0, sizes)
        kept = [any(b["type"] == "thinking" for b in m["content"]) for m in edited.body["messages"] if m["role"] == "assistant"]
        assert kept == [False, False, False, False, True, True, True, True]
        assert edited.applied == (
            {"type": "clear_thinking_20251015", "cleared_thinking_turns": 2, "cleared_input_tokens": 4 * 52},
        )

    def test_keep_all_changes_nothing(self) -> None:
        body = {"model": CLAUDE, "max_tokens": 64, "messages": thinking_turns(3), "context_management": CLAUDE_CODE}
        assert apply_edits(body, requested_edits(body), lambda: 0, sizes).body is body

    def test_a_message_of_thinking_alone_is_left_as_it_is(self) -> None:
        messages = thinking_turns(3)
        messages[1]["content"] = messages[1]["content"][:1]
        edited = apply_edits({"messages": messages}, (ClearThinking(1),), lambda: 0, sizes)
        assert edited.body["messages"][1] == messages[1] and edited.body["messages"][3] != messages[3]


class TestWithoutEdits:
    def test_the_field_goes_when_it_held_only_these_edits(self) -> None:
        assert "context_management" not in without_edits(tool_loop(1, 5, CLAUDE_CODE))

    def test_an_edit_of_another_kind_stays(self) -> None:
        management = {"edits": [{"type": "compact_20260112"}, {"type": "clear_tool_uses_20250919"}]}
        assert without_edits(tool_loop(1, 5, management))["context_management"] == {"edits": [{"type": "compact_20260112"}]}

    def test_the_beta_flag_goes_and_the_others_stay(self) -> None:
        assert without_beta("interleaved-thinking-2025-05-14, context-management-2025-06-27") == (
            "interleaved-thinking-2025-05-14"
        )


APPLIED = {"context_management": {"applied_edits": [{"type": "clear_tool_uses_20250919", "cleared_tool_uses": 2, "cleared_input_tokens": 900}]}}


def sse(*events: tuple[str, dict[str, Any]]) -> bytes:
    return b"".join(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events)


class TestAnswerAmendment:
    def test_a_whole_message_gets_the_field_at_its_top(self) -> None:
        amend = WholeAnswer(APPLIED)
        message = {"type": "message", "content": [{"type": "text", "text": "hi"}]}
        body = json.dumps(message).encode()
        out = amend.feed(body[:10]) + amend.feed(body[10:]) + amend.finish()
        assert json.loads(out) == {**message, **APPLIED}

    def test_a_body_that_is_not_a_message_passes_as_it_came(self) -> None:
        amend = WholeAnswer(APPLIED)
        assert amend.feed(b"not json") + amend.finish() == b"not json"

    @pytest.mark.parametrize("cut", [1, 7, 40, 1000])
    def test_a_stream_gets_the_field_in_its_message_delta_and_nothing_else_changes(self, cut: int) -> None:
        delta = {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}}
        start, stop = ("message_start", {"type": "message_start"}), ("message_stop", {"type": "message_stop"})
        stream = sse(start, ("message_delta", delta), stop)
        amend = StreamedAnswer(APPLIED)
        out = b"".join(amend.feed(stream[k : k + cut]) for k in range(0, len(stream), cut)) + amend.finish()
        assert out == sse(start, ("message_delta", {**delta, **APPLIED}), stop)


def fitted(body: dict[str, Any], window: int, by_guard: bool = False, adapter: Any = None) -> Fitted:
    adapter = adapter or MessagesAdapter()
    counting = Counting(profile(window, CLAUDE), tokenizer(CLAUDE), edits_by_guard=by_guard)
    return fit(adapter, adapter.parse(body), counting, TrimPolicy())


WINDOW = 16_000
TRIGGER = clear_tool_uses(trigger={"type": "input_tokens", "value": 6000}, keep={"type": "tool_uses", "value": 3})


class TestCountedAfterTheEdits:
    def test_a_request_within_the_window_once_cleared_is_forwarded_as_received(self) -> None:
        body = tool_loop(24, 700, TRIGGER)
        plain = fitted(tool_loop(24, 700), WINDOW)
        made = fitted(body, WINDOW)
        assert plain.plan.result.outcome == "trimmed" and made.plan.result.outcome == "unchanged"
        assert made.body is made.parsed.body and not made.plan.rewritten
        assert made.original_tokens == plain.plan.count.total > WINDOW > made.plan.count.total
        provider = dict(apply_edits(body, requested_edits(body), lambda: 10**6, sizes).body)
        assert cookbook_count(provider) < made.plan.count.total  # an independent count of what the provider keeps

    def test_what_still_does_not_fit_is_cut_from_the_cleared_request(self) -> None:
        body = tool_loop(24, 700, clear_tool_uses(trigger={"type": "input_tokens", "value": 6000}, keep={"type": "tool_uses", "value": 20}))
        made = fitted(body, WINDOW)
        sent = dict(made.body)
        assert made.plan.result.outcome == "trimmed" and made.plan.result.tokens_after <= made.plan.result.budget.input_budget
        assert messages_problems(sent) == [] and sent["messages"][-1] == body["messages"][-1]
        assert CLEARED in results_of(sent) and sent["context_management"] == body["context_management"]
        assert cookbook_count(sent) < made.plan.result.budget.input_budget

    def test_claude_codes_request_is_counted_and_forwarded_as_without_the_field(self) -> None:
        body = tool_loop(3, 50, CLAUDE_CODE)
        made, plain = fitted(body, WINDOW), fitted(tool_loop(3, 50), WINDOW)
        assert made.body is made.parsed.body and made.plan.count.total == plain.plan.count.total == made.original_tokens

    def test_an_uncertain_trigger_is_taken_not_to_fire_for_a_provider(self) -> None:
        """Claude's count is a bound: the provider surely clears only once the bound's least exceeds the trigger."""
        body = tool_loop(24, 700, TRIGGER)
        total = fitted(tool_loop(24, 700), WINDOW).plan.count.total
        high = clear_tool_uses(trigger={"type": "input_tokens", "value": total - 10}, keep={"type": "tool_uses", "value": 3})
        assert fitted({**body, "context_management": high}, WINDOW * 4).plan.count.total == total
        assert fitted({**body, "context_management": high}, WINDOW * 4, by_guard=True).plan.count.total < total

    def test_an_uncertain_clear_at_least_is_taken_not_to_hold_for_a_provider(self) -> None:
        """What clearing frees is taken at its least: the provider surely clears only when that is enough."""
        management = clear_tool_uses(
            trigger={"type": "input_tokens", "value": 6000},
            clear_at_least={"type": "input_tokens", "value": 15_000},
        )
        body = tool_loop(24, 700, management)
        total = fitted(tool_loop(24, 700), WINDOW).plan.count.total
        assert fitted(body, WINDOW * 4).plan.count.total == total
        assert fitted(body, WINDOW * 4, by_guard=True).plan.count.total < total - 15_000

    def test_the_count_endpoint_answers_with_the_count_before_the_edits_too(self) -> None:
        body = {k: v for k, v in tool_loop(24, 700, TRIGGER).items() if k != "max_tokens"}
        adapter = CountTokensAdapter()
        made = fitted(body, WINDOW, adapter=adapter)
        answer = adapter.count_answer({"input_tokens": made.plan.count.total}, made.original_tokens)
        assert answer["context_management"]["original_input_tokens"] > answer["input_tokens"]
        assert adapter.count_answer({"input_tokens": 5}, None) == {"input_tokens": 5}


class TestAppliedByTheGuard:
    def test_the_cleared_body_is_sent_without_the_field_and_the_answer_says_what_went(self) -> None:
        body = tool_loop(24, 700, TRIGGER)
        made = fitted(body, WINDOW, by_guard=True)
        sent = dict(made.body)
        assert made.plan.rewritten and "context_management" not in sent
        assert results_of(sent).count(CLEARED) == 21 and messages_problems(sent) == []
        (applied,) = made.plan.answer["context_management"]["applied_edits"]  # type: ignore[index]
        assert applied["cleared_tool_uses"] == 21 and applied["cleared_input_tokens"] > 0

    def test_claude_codes_request_loses_only_the_field(self) -> None:
        body = tool_loop(3, 50, CLAUDE_CODE)
        made = fitted(body, WINDOW, by_guard=True)
        assert made.body == {k: v for k, v in body.items() if k != "context_management"}
        assert made.plan.rewritten and made.plan.answer is None

    def test_a_cut_request_goes_without_the_field_too(self) -> None:
        body = tool_loop(24, 700, clear_tool_uses(trigger={"type": "input_tokens", "value": 6000}, keep={"type": "tool_uses", "value": 20}))
        made = fitted(body, WINDOW, by_guard=True)
        assert made.plan.result.outcome == "trimmed" and "context_management" not in made.body
