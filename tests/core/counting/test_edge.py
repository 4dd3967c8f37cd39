"""When the provider is asked for its count, where, and how its answer is read (proxy.core.counting.edge)."""

from __future__ import annotations

import pytest

from proxy.core.counting.edge import (
    Bounded,
    CountCall,
    bound_ratio_of,
    lower_bound,
    read_count,
    responses_body,
    straddles,
    vertex_body,
)
from tests.support.tool_chat import CHAT


class _BoundTokenizer:
    bound_ratio = 1.5


class TestBounds:
    def test_an_exact_count_is_its_own_lower_bound(self) -> None:
        assert lower_bound(1000, True, None) == 1000

    def test_a_bound_with_a_ratio_gives_the_least_the_real_count_can_be(self) -> None:
        assert lower_bound(1000, False, 1.5) == 666

    def test_a_bound_without_a_ratio_has_no_lower_bound(self) -> None:
        assert lower_bound(1000, False, None) is None

    def test_the_larger_of_the_tokenizers_own_ratio_and_the_assumed_one_is_taken(self) -> None:
        """A larger ratio only widens the band where the provider is asked."""
        assert isinstance(_BoundTokenizer(), Bounded)
        assert bound_ratio_of(_BoundTokenizer(), 3.0) == 3.0
        assert bound_ratio_of(_BoundTokenizer(), 1.2) == 1.5
        assert bound_ratio_of(_BoundTokenizer()) == 1.5
        assert bound_ratio_of(object(), 3.0) == 3.0

    @pytest.mark.parametrize(
        ("upper", "lower", "budget", "asked"),
        [
            (2000, 1000, 1800, True),  # may fit: only the provider knows
            (1700, 850, 1800, False),  # fits even by its upper bound
            (5000, 2500, 1800, False),  # does not fit even by its lower bound
            (2000, None, 1800, False),  # nothing known below the count
            (1800, 900, 1800, False),  # exactly the budget fits
        ],
    )
    def test_only_a_request_whose_bounds_straddle_the_budget_is_asked_about(
        self, upper: int, lower: int | None, budget: int, asked: bool
    ) -> None:
        assert straddles(upper, lower, budget) is asked


class TestAnswers:
    @pytest.mark.parametrize(
        ("kind", "answer", "count"),
        [
            ("anthropic", {"input_tokens": 1234}, 1234),
            ("openai", {"object": "response.input_tokens", "input_tokens": 77}, 77),
            ("vertex", {"totalTokens": 31, "totalBillableCharacters": 96}, 31),
            ("vertex", {"error": {"code": 400}}, None),
            ("openai", {"input_tokens": "12"}, None),
            ("anthropic", ["not", "an", "object"], None),
        ],
    )
    def test_each_answer_is_read_from_its_documented_field(self, kind: str, answer: object, count: int | None) -> None:
        field = "totalTokens" if kind == "vertex" else "input_tokens"
        assert read_count(CountCall("u", {}, field), answer) == count

    def test_the_cache_key_follows_the_body_not_its_key_order(self) -> None:
        one = CountCall("u", {"a": 1, "b": [1, 2]}, "input_tokens")
        other = CountCall("u", {"b": [1, 2], "a": 1}, "input_tokens")
        changed = CountCall("u", {"a": 1, "b": [1, 3]}, "input_tokens")
        assert one.key("up", "m") == other.key("up", "m") != changed.key("up", "m")
        assert one.key("up", "m") != one.key("other", "m")


class TestResponsesBody:
    def test_a_chat_body_becomes_responses_items(self) -> None:
        request = responses_body(CHAT)
        assert request is not None
        assert request["input"] == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": '{"city":"Oslo"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "rain"},
        ]
        assert request["tools"] == [{"type": "function", "name": "weather", "parameters": {"type": "object"}}]
        assert request["tool_choice"] == {"type": "function", "name": "weather"}

    def test_an_image_becomes_an_input_image(self) -> None:
        chat = {
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/i.png"}}]}]
        }
        request = responses_body(chat)
        assert request is not None
        assert request["input"][0]["content"] == [
            {"type": "input_image", "image_url": "https://x/i.png", "detail": "auto"}
        ]

    def test_a_part_it_cannot_say_leaves_the_request_unasked(self) -> None:
        assert responses_body({"messages": [{"role": "user", "content": [{"type": "input_audio"}]}]}) is None


class TestVertexBody:
    def test_a_chat_body_becomes_contents_with_calls_and_responses(self) -> None:
        request = vertex_body(CHAT)
        assert request == {
            "contents": [
                {"role": "user", "parts": [{"text": "Weather?"}]},
                {"role": "model", "parts": [{"functionCall": {"name": "weather", "args": {"city": "Oslo"}}}]},
                {"role": "user", "parts": [{"functionResponse": {"name": "weather", "response": {"content": "rain"}}}]},
            ],
            "systemInstruction": {"parts": [{"text": "Be brief."}]},
            "tools": [{"functionDeclarations": [{"name": "weather", "parameters": {"type": "object"}}]}],
        }

    def test_content_other_than_text_leaves_the_request_unasked(self) -> None:
        chat = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}
        assert vertex_body(chat) is None
