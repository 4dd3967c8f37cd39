"""Each API shape names the top-level fields it did not account for: those it neither counts nor
knows to stay out of the prompt. What the upstream says of such a request is about that request."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.apis.fields import UNREAD_SHOWN
from proxy.apis.registry import AdapterRegistry

REGISTRY = AdapterRegistry()
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": CHAT,
    "/v1/responses": {"model": "m", "input": "hi"},
    "/v1/completions": {"model": "m", "prompt": "hi"},
    "/v1/messages": {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]},
}


def parsed(path: str, **fields: Any) -> Any:
    endpoint = REGISTRY.endpoint_for(path)
    assert endpoint is not None
    return endpoint.parse({**BODIES[path], **fields})


class TestUnreadFields:
    @pytest.mark.parametrize("path", BODIES)
    def test_a_body_of_known_fields_is_read_whole(self, path):
        assert parsed(path, temperature=0.2, stream=False, metadata={"a": "b"}).read_whole

    @pytest.mark.parametrize(
        "options",
        [
            {"top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1, "guided_json": {"type": "object"}},  # vLLM
            {"n_predict": 5, "mirostat": 2, "grammar": "root ::= x", "cache_prompt": True},  # llama.cpp
            {"keep_alive": "5m", "options": {"num_ctx": 4096}},  # Ollama
            {"seed": 1, "logprobs": True, "top_logprobs": 2, "parallel_tool_calls": False, "prediction": {}},
        ],
    )
    def test_the_servers_sampling_options_are_known_to_stay_out_of_the_prompt(self, options):
        assert parsed("/v1/chat/completions", **options).unread == ()

    @pytest.mark.parametrize(
        ("path", "field"),
        [
            ("/v1/chat/completions", "rag_context"),  # a server's own extension, rendered by its template
            ("/v1/chat/completions", "chat_template"),  # a client's own template: anything at all
            ("/v1/chat/completions", "chat_template_kwargs"),
            ("/v1/responses", "conversation"),
            ("/v1/completions", "some_new_field"),
            ("/v1/messages", "mcp_servers"),  # their tools' definitions join the prompt
        ],
    )
    def test_a_field_that_may_reach_the_prompt_is_named(self, path, field):
        result = parsed(path, **{field: [{"text": "x"}]})
        assert result.unread == (field,) and not result.read_whole

    def test_vllm_s_documents_are_counted_not_unread(self):
        assert parsed("/v1/chat/completions", documents=[{"title": "t", "text": "x"}]).read_whole

    def test_context_kept_by_the_provider_is_not_read_whole_either(self):
        result = parsed("/v1/responses", previous_response_id="resp_1")
        assert result.server_state and not result.read_whole

    def test_only_a_few_names_are_kept_each_cut_short(self):
        result = parsed("/v1/chat/completions", **{f"x{i}" + "y" * 100: 1 for i in range(20)})
        assert len(result.unread) == UNREAD_SHOWN and all(len(name) == 64 for name in result.unread)
