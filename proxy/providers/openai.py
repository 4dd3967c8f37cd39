"""OpenAI and Azure OpenAI: chat completions, Responses and legacy completions, a key as a bearer
token (Azure's in `api-key`), and OpenAI's count endpoint.

OpenAI counts at `POST /v1/responses/input_tokens`: a Responses body (a chat body is rewritten as
one, `proxy.core.counting.edge.responses_body`), answered `{"object": "response.input_tokens",
"input_tokens": N}`; it counts a stored response or conversation the request names with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from proxy.core.counting.edge import CountCall, responses_body
from proxy.providers.provider import BackendProfile, Provider

OPENAI_SHAPES = ("chat", "responses", "completions")
# What `/responses/input_tokens` reads of a request; the rest (max_output_tokens, sampling) it refuses.
_RESPONSES_FIELDS = (
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "reasoning",
    "text",
    "truncation",
    "conversation",
    "previous_response_id",
)


class OpenAI(Provider):
    kind: ClassVar[str] = "openai"
    shapes: ClassVar[tuple[str, ...]] = OPENAI_SHAPES
    backend_kind: ClassVar[str] = "openai"
    backend: ClassVar[BackendProfile | None] = BackendProfile(
        "openai", True, True, ("maximum context length is", "context_length_exceeded", "your messages resulted in")
    )
    counts_held_with_request: ClassVar[frozenset[str]] = frozenset({"response", "conversation"})

    count_endpoint: ClassVar[bool] = True

    def count_call(self, base_url: str, model: str, api: str, body: Mapping[str, Any]) -> CountCall | None:
        request = dict(body) if api == "responses" else responses_body(body) if api == "chat" else None
        if request is None:
            return None
        picked = {k: request[k] for k in _RESPONSES_FIELDS if k in request}
        url = f"{base_url.rstrip('/')}/responses/input_tokens"
        return CountCall(url, {**picked, "model": model}, "input_tokens")


class Azure(Provider):
    """Azure OpenAI: OpenAI's shapes under deployments, its key in `api-key`; no count endpoint."""

    kind: ClassVar[str] = "azure"
    shapes: ClassVar[tuple[str, ...]] = OPENAI_SHAPES
    backend_kind: ClassVar[str] = "openai"
    key_header: ClassVar[str | None] = "api-key"
    chat_at_base_url: ClassVar[bool] = False  # under `/openai/deployments/{deployment}/`
