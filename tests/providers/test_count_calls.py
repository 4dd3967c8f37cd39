"""Each provider's count endpoint: the call it builds for a request, per API shape
(`Provider.count_call`, proxy.providers); the server sends it at the budget's edge."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from proxy.core.counting.edge import CountCall
from proxy.providers.kinds import provider_for
from tests.support.tool_chat import CHAT


def count_call(kind: str, base_url: str, model: str, api: str, body: Mapping[str, Any]) -> CountCall | None:
    """The call the provider of upstream kind `kind` builds."""
    return provider_for(kind).count_call(base_url, model, api, body)


class TestCountCalls:
    def test_anthropic_counts_the_messages_body_without_max_tokens_or_sampling(self) -> None:
        body = {"model": "x", "max_tokens": 9, "temperature": 1, "system": "s", "messages": [], "tools": []}
        call = count_call("anthropic", "https://api.anthropic.com/v1", "claude-sonnet-4-5", "messages", body)
        assert call is not None and call.url == "https://api.anthropic.com/v1/messages/count_tokens"
        assert call.body == {"model": "claude-sonnet-4-5", "system": "s", "messages": [], "tools": []}

    def test_anthropic_s_count_call_names_the_api_version_a_client_may_not_have_sent(self) -> None:
        call = count_call("anthropic", "https://api.anthropic.com", "claude-sonnet-4-5", "messages", {"messages": []})
        assert call is not None and call.url == "https://api.anthropic.com/v1/messages/count_tokens"
        assert call.headers == {"anthropic-version": "2023-06-01"}

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
        assert call is not None and call.answer_field == "totalTokens"
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
