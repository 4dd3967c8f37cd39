"""When the provider is asked for its count, where, and how its answer is read (proxy.core.counting.edge)."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.core.counting.edge import (
    Bounded,
    CountCall,
    bound_ratio_of,
    count_call,
    lower_bound,
    read_count,
    responses_body,
    straddles,
    vertex_body,
)

CHAT: dict[str, Any] = {
    "model": "m",
    "max_tokens": 100,
    "temperature": 0.2,
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "rain"},
    ],
    "tools": [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}],
    "tool_choice": {"type": "function", "function": {"name": "weather"}},
}


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


class TestCountCalls:
    def test_anthropic_counts_the_messages_body_without_max_tokens_or_sampling(self) -> None:
        body = {"model": "x", "max_tokens": 9, "temperature": 1, "system": "s", "messages": [], "tools": []}
        call = count_call("anthropic", "https://api.anthropic.com/v1", "claude-sonnet-4-5", "messages", body)
        assert call is not None and call.url == "https://api.anthropic.com/v1/messages/count_tokens"
        assert call.body == {"model": "claude-sonnet-4-5", "system": "s", "messages": [], "tools": []}

    def test_openai_counts_a_responses_body_at_input_tokens(self) -> None:
        body = {"model": "x", "input": "hi", "instructions": "be brief", "max_output_tokens": 5, "store": False}
        call = count_call("openai", "https://api.openai.com/v1", "gpt-5", "responses", body)
        assert call is not None and call.url == "https://api.openai.com/v1/responses/input_tokens"
        assert call.body == {"model": "gpt-5", "input": "hi", "instructions": "be brief"}

    def test_vertex_counts_at_the_publisher_models_count_tokens(self) -> None:
        base = "https://us-central1-aiplatform.googleapis.com/v1/projects/p/locations/us-central1/endpoints/openapi"
        call = count_call("vertex", base, "google/gemini-2.5-pro", "chat", CHAT)
        assert call is not None
        assert call.url == (
            "https://us-central1-aiplatform.googleapis.com/v1/projects/p/locations/us-central1"
            "/publishers/google/models/gemini-2.5-pro:countTokens"
        )

    def test_a_native_gemini_request_is_counted_whole_at_the_developer_api_s_count_tokens(self) -> None:
        body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "generationConfig": {"temperature": 1}}
        call = count_call(
            "gemini", "https://generativelanguage.googleapis.com", "gemini-2.5-flash", "generate_content", body
        )
        assert call is not None
        assert call.url == "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:countTokens"
        assert call.body == {
            "generateContentRequest": {"contents": body["contents"], "model": "models/gemini-2.5-flash"}
        }

    def test_a_native_vertex_request_is_counted_under_the_base_s_project_never_the_openai_endpoint(self) -> None:
        base = "https://us-central1-aiplatform.googleapis.com/v1/projects/p/locations/us-central1/endpoints/openapi"
        body = {"contents": [], "systemInstruction": {"parts": [{"text": "x"}]}, "safetySettings": []}
        call = count_call("vertex", base, "gemini-2.5-pro", "generate_content", body)
        assert call is not None and call.body == {"contents": [], "systemInstruction": {"parts": [{"text": "x"}]}}
        assert call.url.endswith(
            "/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.5-pro:countTokens"
        )

    @pytest.mark.parametrize(
        "base",
        [
            "https://aiplatform.googleapis.com",
            "https://aiplatform.googleapis.com/v1",
            "https://aiplatform.googleapis.com/v1/publishers/google",
        ],
    )
    def test_an_express_mode_vertex_request_is_counted_at_the_publisher_path_without_a_project(self, base: str) -> None:
        call = count_call("vertex", base, "gemini-2.5-pro", "generate_content", {"contents": []})
        assert call is not None
        assert call.url == "https://aiplatform.googleapis.com/v1/publishers/google/models/gemini-2.5-pro:countTokens"

    @pytest.mark.parametrize("model", ["x/..", "m?alt=1", "m#f", "..", "m x", "m%2F"])
    def test_an_express_mode_model_name_that_is_not_plain_is_never_put_in_a_count_url(self, model: str) -> None:
        assert count_call("vertex", "https://aiplatform.googleapis.com/v1", model, "generate_content", {}) is None

    @pytest.mark.parametrize("model", ["x/..", "m?alt=1", "m#f", "..", "m x", "m%2F"])
    def test_a_model_name_that_is_not_plain_is_never_put_in_a_count_url(self, model: str) -> None:
        assert count_call("gemini", "https://g", model, "generate_content", {"contents": []}) is None


class TestVertexExpressMode:
    """Vertex AI in express mode (an API key, the global host, no project or location in any path):
    countTokens at `/v1/publishers/google/models/{model}:countTokens` (Google's express mode REST
    reference)."""

    @pytest.mark.parametrize(
        "base",
        [
            "https://aiplatform.googleapis.com",
            "https://aiplatform.googleapis.com/",
            "https://aiplatform.googleapis.com/v1",
        ],
    )
    def test_a_base_without_a_project_is_counted_at_express_mode_s_path(self, base: str) -> None:
        body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "generationConfig": {"temperature": 1}}
        call = count_call("vertex", base, "gemini-2.5-flash", "generate_content", body)
        assert call is not None and call.kind == "vertex" and call.answer_field == "totalTokens"
        assert call.url == "https://aiplatform.googleapis.com/v1/publishers/google/models/gemini-2.5-flash:countTokens"
        assert call.body == {"contents": body["contents"]}

    def test_a_v1beta1_base_keeps_its_version(self) -> None:
        call = count_call("vertex", "https://aiplatform.googleapis.com/v1beta1", "gemini-3-pro-preview",
                          "generate_content", {"contents": []})  # fmt: skip
        assert call is not None
        assert call.url == (
            "https://aiplatform.googleapis.com/v1beta1/publishers/google/models/gemini-3-pro-preview:countTokens"
        )

    def test_a_served_name_with_its_publisher_is_asked_by_its_last_segment(self) -> None:
        call = count_call(
            "vertex", "https://aiplatform.googleapis.com", "google/gemini-2.5-pro", "generate_content", {}
        )
        assert call is not None and call.url.endswith("/v1/publishers/google/models/gemini-2.5-pro:countTokens")

    @pytest.mark.parametrize("model", ["x/..", "m?alt=1", "m#f", "..", "m x", "m%2F"])
    def test_a_model_name_that_is_not_plain_is_never_put_in_an_express_count_url(self, model: str) -> None:
        assert count_call("vertex", "https://aiplatform.googleapis.com", model, "generate_content", {}) is None

    def test_a_base_with_a_project_but_no_location_is_asked_nothing(self) -> None:
        base = "https://aiplatform.googleapis.com/v1/projects/p"
        assert count_call("vertex", base, "gemini-2.5-flash", "generate_content", {"contents": []}) is None

    def test_an_upstream_without_a_count_endpoint_is_not_asked(self) -> None:
        assert count_call("generic", "http://h/v1", "m", "chat", CHAT) is None
        assert count_call("anthropic", "http://h/v1", "m", "chat", CHAT) is None

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
        assert read_count(CountCall(kind, "u", {}, field), answer) == count  # type: ignore[arg-type]

    def test_the_cache_key_follows_the_body_not_its_key_order(self) -> None:
        one = CountCall("openai", "u", {"a": 1, "b": [1, 2]}, "input_tokens")
        other = CountCall("openai", "u", {"b": [1, 2], "a": 1}, "input_tokens")
        changed = CountCall("openai", "u", {"a": 1, "b": [1, 3]}, "input_tokens")
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
