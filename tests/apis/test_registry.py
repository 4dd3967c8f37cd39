"""The registry: one adapter per canonical path, the model a path names, the local endpoints."""

from __future__ import annotations

import subprocess
import sys

import pytest

from proxy.apis.base import InvalidRequest
from proxy.apis.openai.completions import CompletionsAdapter, CompletionsOptions
from proxy.apis.registry import API_NAMES, AdapterRegistry

REGISTRY = AdapterRegistry()


class TestEndpointFor:
    @pytest.mark.parametrize(
        ("path", "api"),
        [
            ("/v1/chat/completions", "chat"),
            ("/chat/completions", "chat"),
            ("/openai/v1/chat/completions", "chat"),
            ("/openai/deployments/my-gpt4o/chat/completions", "chat"),
            ("/v1/responses", "responses"),
            ("/openai/v1/responses", "responses"),
            ("/v1/completions", "completions"),
            ("/openai/deployments/instruct/completions", "completions"),
            ("/v1/messages", "messages"),
            ("/v1/messages/count_tokens", "messages.count_tokens"),
            (
                "/v1/projects/p/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5@20250929:rawPredict",
                "messages",
            ),
        ],
    )
    def test_each_guarded_path_has_its_adapter(self, path: str, api: str) -> None:
        endpoint = REGISTRY.endpoint_for(path)
        assert endpoint is not None and endpoint.api == api

    @pytest.mark.parametrize(
        "path",
        [
            "/v1/responses/resp_1",
            "/v1/models",
            "/v1/embeddings",
            "/openai/deployments/x/embeddings",
        ],
    )
    def test_other_paths_are_left_to_the_pass_through_policy(self, path: str) -> None:
        assert REGISTRY.endpoint_for(path) is None

    @pytest.mark.parametrize("path", ["/v1/responses/compact", "/responses/compact", "/openai/v1/responses/compact"])
    def test_a_standalone_compaction_is_a_counted_responses_request(self, path: str) -> None:
        """`/v1/responses/compact` is counted by the Responses adapter, as a compaction request,
        and goes to an upstream that serves the Responses API."""
        endpoint = REGISTRY.endpoint_for(path)
        assert endpoint is not None and endpoint.api == "responses" and not endpoint.local
        parsed = endpoint.parse({"model": "gpt-4o", "input": [{"role": "user", "content": "hi"}]})
        assert parsed.messages[-1]["role"] == "user" and parsed.messages[-1]["content"] == ""
        assert any("compacts with" in note for note in parsed.notes)

    def test_an_azure_deployment_names_the_model_when_the_body_does_not(self) -> None:
        endpoint = REGISTRY.endpoint_for("/openai/deployments/prod-gpt4o/chat/completions")
        assert endpoint is not None
        assert endpoint.parse({"messages": [{"role": "user", "content": "hi"}]}).model == "prod-gpt4o"

    def test_the_deployment_wins_over_a_model_in_the_body(self) -> None:
        """Azure serves the deployment the path names and ignores the body's model: so does the guard."""
        endpoint = REGISTRY.endpoint_for("/openai/deployments/prod/chat/completions")
        assert endpoint is not None
        assert endpoint.parse({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).model == "prod"

    def test_a_request_with_no_model_anywhere_is_refused(self) -> None:
        endpoint = REGISTRY.endpoint_for("/v1/chat/completions")
        assert endpoint is not None
        with pytest.raises(InvalidRequest) as error:
            endpoint.parse({"messages": [{"role": "user", "content": "hi"}]})
        assert error.value.param == "model"

    def test_count_tokens_is_answered_locally(self) -> None:
        endpoint = REGISTRY.endpoint_for("/v1/messages/count_tokens")
        assert endpoint is not None and endpoint.local

    def test_vertex_stream_raw_predict_asks_for_a_stream(self) -> None:
        endpoint = REGISTRY.endpoint_for(
            "/v1/projects/p/locations/l/publishers/anthropic/models/claude-opus-4-1:streamRawPredict"
        )
        assert endpoint is not None and endpoint.stream and endpoint.path_model == "claude-opus-4-1"


class TestDetect:
    @pytest.mark.parametrize(
        ("body", "api"),
        [
            ({"model": "gpt-4o", "input": "hi"}, "responses"),
            ({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}, "chat"),
            ({"model": "davinci-002", "prompt": "hi"}, "completions"),
            (
                {"model": "claude", "system": "s", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
                "messages",
            ),
            (
                {
                    "model": "claude",
                    "max_tokens": 5,
                    "messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}],
                },
                "messages",
            ),
        ],
    )
    def test_the_shape_is_told_from_the_body(self, body: dict, api: str) -> None:
        assert REGISTRY.detect(body).name == api

    def test_an_unknown_api_name_lists_the_known_ones(self) -> None:
        with pytest.raises(ValueError, match="chat, responses, completions, messages"):
            REGISTRY.by_name("graphql")


class TestPurity:
    def test_importing_the_adapters_does_not_load_aiohttp(self) -> None:
        code = "import sys, proxy.apis.registry; print('aiohttp' in sys.modules)"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "False"


class TestShapes:
    """Each shape registers itself once (`SHAPES`): its name, its adapters and its paths."""

    def test_every_shape_is_named_once_and_the_api_names_are_theirs(self) -> None:
        assert tuple(shape.name for shape in REGISTRY.shapes) == API_NAMES
        assert len(set(API_NAMES)) == len(API_NAMES)
        assert all(REGISTRY.by_name(shape.name) is shape.adapter for shape in REGISTRY.shapes)

    def test_no_fixed_path_is_claimed_by_two_shapes(self) -> None:
        claimed = [path for shape in REGISTRY.shapes for path in shape.exact]
        assert len(claimed) == len(set(claimed))

    def test_a_shape_s_options_reach_its_adapter(self) -> None:
        registry = AdapterRegistry(CompletionsOptions(overflow="reject"))
        adapter = registry.by_name("completions")
        assert isinstance(adapter, CompletionsAdapter) and adapter.options.overflow == "reject"

    @pytest.mark.parametrize(
        "path",
        [
            ("v1", "chat", "completions"),
            ("v1", "projects", "p", "locations", "l", "endpoints", "openapi", "chat", "completions"),
            ("v1beta", "models", "gemini-2.5-flash:generateContent"),
            ("v1beta", "models", "gemini-2.5-flash:generate_content"),
            ("v1beta1", "projects", "p", "locations", "l", "interactions"),
        ],
    )
    def test_a_path_that_reaches_a_generating_endpoint_is_known_by_its_shape(self, path: tuple[str, ...]) -> None:
        assert REGISTRY.generates(path)

    @pytest.mark.parametrize("path", [("v1", "models"), ("v1beta", "cachedContents", "c1"), ("v1", "embeddings")])
    def test_other_paths_generate_nothing(self, path: tuple[str, ...]) -> None:
        assert not REGISTRY.generates(path)
