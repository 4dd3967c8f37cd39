"""The provider's own count at the budget's edge, asked of in-process upstreams that speak each
count endpoint's documented shape: Anthropic's `/v1/messages/count_tokens`, OpenAI's
`/v1/responses/input_tokens` and Vertex AI's `:countTokens`.

The requests are counted by estimates (Claude: cl100k x1.45; a model the guard does not know:
cl100k x1.6; Gemini: cl100k x1.25) with an assumed worst case of 2 (`provider_count_ratio`): a
request counted 2,000 may really be 1,000, so against a budget of 1,800 only the provider knows.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.server.conftest import Logs, Proxy, gateway_settings

WINDOW = 2000  # with max_tokens 100 and the 5% margin: an input budget of 1,800
VERTEX_BASE = "/v1/projects/p/locations/us-central1/endpoints/openapi"


class CountingUpstream:
    """An upstream that answers chat, messages and its count endpoint with `answer` (a count, an
    HTTP status to fail with, or a delay); records what each endpoint received."""

    def __init__(self, answer: int, status: int = 200, delay: float = 0.0) -> None:
        self.answer, self.status, self.delay = answer, status, delay
        self.count_bodies: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        self.sent: list[dict[str, Any]] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self.handle)
        app.router.add_get("/v1/models", self.models)
        return app

    async def models(self, request: web.Request) -> web.Response:
        """vLLM's model list: its `max_model_len` gives it away."""
        return web.json_response(
            {"object": "list", "data": [{"id": "Qwen/Qwen2.5-7B-Instruct", "max_model_len": WINDOW}]}
        )

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        path = request.path
        if path == "/tokenize" and "messages" in body:  # vLLM's chat template applied
            self.count_bodies.append((path, body, dict(request.headers)))
            return web.json_response({"count": self.answer, "max_model_len": WINDOW, "tokens": []})
        if path.endswith(("/messages/count_tokens", "/responses/input_tokens", ":countTokens")):
            self.count_bodies.append((path, body, dict(request.headers)))
            await asyncio.sleep(self.delay)
            if self.status != 200:
                return web.json_response({"error": {"message": "down"}}, status=self.status)
            if path.endswith(":countTokens"):
                return web.json_response({"totalTokens": self.answer, "totalBillableCharacters": 1})
            if path.endswith("/input_tokens"):
                return web.json_response({"object": "response.input_tokens", "input_tokens": self.answer})
            return web.json_response({"input_tokens": self.answer})
        self.sent.append(body)
        if path.endswith("/messages"):
            return web.json_response(
                {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": body["model"],
                    "content": [{"type": "text", "text": "ok"}],
                    "stop_reason": "end_turn",
                    "usage": {"input_tokens": 1, "output_tokens": 1},
                }
            )
        return web.json_response(
            {
                "id": "c1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            }
        )


def conversation(words: int) -> list[dict[str, str]]:
    """A system prompt and alternating turns of about `words` words in all."""
    messages = [{"role": "system", "content": "You are terse."}]
    for i in range(words // 50):
        role = "user" if i % 2 == 0 else "assistant"
        messages.append({"role": role, "content": f"turn {i}: " + "the river runs to the sea " * 8})
    messages.append({"role": "user", "content": "and now?"})
    return messages


async def start(
    aiohttp_server: Any, start_proxy: Proxy, fake: CountingUpstream, kind: str, base: str = "/v1", **options: Any
) -> tuple[TestServer, str]:
    server = await aiohttp_server(fake.app())
    url = str(server.make_url(base))
    upstream = {"base_url": url, "kind": kind, "read_timeout": 5, "connect_timeout": 2, "provider_count_ratio": 2.0}
    upstream.update(options)
    settings = gateway_settings(
        url,
        upstreams={"up": upstream},
        models={"overrides": [{"match": "*", "context_window": WINDOW}]},
    )
    return await start_proxy(settings), url


async def post(
    proxy: TestServer, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        async with session.post(str(proxy.make_url(path)), json=body, headers=headers) as response:
            return response.status, await response.json()


def last_request(logs: Logs) -> dict[str, Any]:
    return logs.events("request")[-1]


class TestAnthropicCountTokens:
    async def test_a_request_the_provider_counts_within_the_budget_goes_untouched(
        self, aiohttp_server: Any, start_proxy: Proxy, logs: Logs
    ) -> None:
        fake = CountingUpstream(answer=1500)
        proxy, _ = await start(aiohttp_server, start_proxy, fake, "anthropic")
        messages = conversation(1800)
        body = {"model": "claude-sonnet-4-5", "max_tokens": 100, "system": "Be brief.", "messages": messages[1:]}
        status, _ = await post(proxy, "/v1/messages", body, {"x-api-key": "client-key", "x-trace": "t"})
        assert status == 200
        path, counted, headers = fake.count_bodies[0]
        assert headers.get("x-api-key") == "client-key" and "x-trace" not in headers  # who asks, nothing else
        assert path == "/v1/messages/count_tokens"
        assert "max_tokens" not in counted and counted["system"] == "Be brief." and counted["messages"] == messages[1:]
        assert headers.get("anthropic-version")
        assert fake.sent[0]["messages"] == messages[1:]  # nothing cut
        event = last_request(logs)
        assert event["count_source"] == "provider" and event["tokens_before"] == 1500

    async def test_a_provider_count_over_the_budget_leaves_the_cut_made_on_the_upper_bound(
        self, aiohttp_server: Any, start_proxy: Proxy, logs: Logs
    ) -> None:
        fake = CountingUpstream(answer=1900)
        proxy, _ = await start(aiohttp_server, start_proxy, fake, "anthropic")
        messages = conversation(1800)[1:]
        await post(proxy, "/v1/messages", {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": messages})
        assert len(fake.count_bodies) == 1
        assert len(fake.sent[0]["messages"]) < len(messages)
        assert "provider_count_over_budget" in last_request(logs)["notes"]

    async def test_the_budget_is_the_one_the_clients_own_max_tokens_leaves(
        self, aiohttp_server: Any, start_proxy: Proxy, logs: Logs
    ) -> None:
        """max_tokens 600 leaves 1,300: a provider count of 1,350 does not fit, whatever the cut lowered."""
        fake = CountingUpstream(answer=1350)
        proxy, _ = await start(aiohttp_server, start_proxy, fake, "anthropic")
        messages = conversation(1200)[1:]
        await post(proxy, "/v1/messages", {"model": "claude-sonnet-4-5", "max_tokens": 600, "messages": messages})
        assert len(fake.count_bodies) == 1
        assert fake.sent[0]["messages"] != messages
        assert last_request(logs)["count_source"] != "provider"

    async def test_a_failing_endpoint_cuts_to_the_upper_bound(
        self, aiohttp_server: Any, start_proxy: Proxy, logs: Logs
    ) -> None:
        fake = CountingUpstream(answer=0, status=503)
        proxy, _ = await start(aiohttp_server, start_proxy, fake, "anthropic")
        messages = conversation(1800)[1:]
        await post(proxy, "/v1/messages", {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": messages})
        assert len(fake.sent[0]["messages"]) < len(messages)
        event = last_request(logs)
        assert "provider_count_failed" in event["notes"] and event["count_source"] != "provider"

    async def test_a_late_answer_is_not_waited_for_past_the_deadline(
        self, aiohttp_server: Any, start_proxy: Proxy, logs: Logs
    ) -> None:
        fake = CountingUpstream(answer=1500, delay=3.0)
        proxy, _ = await start(aiohttp_server, start_proxy, fake, "anthropic", provider_count_timeout=0.2)
        messages = conversation(1800)[1:]
        await post(proxy, "/v1/messages", {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": messages})
        assert len(fake.sent[0]["messages"]) < len(messages)
        assert "provider_count_failed" in last_request(logs)["notes"]

    async def test_the_same_request_again_is_answered_from_the_kept_count(
        self, aiohttp_server: Any, start_proxy: Proxy, logs: Logs
    ) -> None:
        fake = CountingUpstream(answer=1500)
        proxy, _ = await start(aiohttp_server, start_proxy, fake, "anthropic")
        body = {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": conversation(1800)[1:]}
        await post(proxy, "/v1/messages", body)
        await post(proxy, "/v1/messages", body)
        assert len(fake.count_bodies) == 1 and len(fake.sent) == 2
        assert last_request(logs)["count_source"] == "provider"

    @pytest.mark.parametrize("words", [60, 4000])
    async def test_requests_away_from_the_edge_ask_nothing(
        self, aiohttp_server: Any, start_proxy: Proxy, words: int
    ) -> None:
        """One fits even counted by its upper bound; the other does not fit even by its lower."""
        fake = CountingUpstream(answer=10)
        proxy, _ = await start(aiohttp_server, start_proxy, fake, "anthropic")
        body = {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": conversation(words)[1:]}
        await post(proxy, "/v1/messages", body)
        assert fake.count_bodies == [] and len(fake.sent) == 1

    async def test_switched_off_it_asks_nothing(self, aiohttp_server: Any, start_proxy: Proxy) -> None:
        fake = CountingUpstream(answer=1500)
        proxy, _ = await start(aiohttp_server, start_proxy, fake, "anthropic", provider_count=False)
        body = {"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": conversation(1800)[1:]}
        await post(proxy, "/v1/messages", body)
        assert fake.count_bodies == [] and len(fake.sent[0]["messages"]) < len(body["messages"])


class TestOpenAIInputTokens:
    async def test_a_chat_request_is_counted_as_a_responses_body(
        self, aiohttp_server: Any, start_proxy: Proxy, logs: Logs
    ) -> None:
        fake = CountingUpstream(answer=1700)
        proxy, _ = await start(aiohttp_server, start_proxy, fake, "openai")
        messages = conversation(1800)
        body = {"model": "gpt-next-preview", "max_tokens": 100, "messages": messages}
        status, _ = await post(proxy, "/v1/chat/completions", body)
        assert status == 200
        path, counted, _ = fake.count_bodies[0]
        assert path == "/v1/responses/input_tokens"
        assert counted["model"] == "gpt-next-preview" and "max_tokens" not in counted
        assert counted["input"][0] == {"role": "system", "content": "You are terse."}
        assert len(counted["input"]) == len(messages)
        assert fake.sent[0]["messages"] == messages
        assert last_request(logs)["count_source"] == "provider"


class TestVertexCountTokens:
    async def test_a_chat_request_is_counted_by_the_models_count_tokens(
        self, aiohttp_server: Any, start_proxy: Proxy, logs: Logs
    ) -> None:
        fake = CountingUpstream(answer=1600)
        proxy, _ = await start(aiohttp_server, start_proxy, fake, "vertex", base=VERTEX_BASE)
        messages = conversation(1800)
        body = {"model": "google/gemini-2.5-pro", "max_tokens": 100, "messages": messages}
        status, _ = await post(proxy, "/v1/chat/completions", body)
        assert status == 200
        path, counted, _ = fake.count_bodies[0]
        assert path == "/v1/projects/p/locations/us-central1/publishers/google/models/gemini-2.5-pro:countTokens"
        assert counted["systemInstruction"] == {"parts": [{"text": "You are terse."}]}
        assert [c["role"] for c in counted["contents"][:2]] == ["user", "model"]
        assert fake.sent[0]["messages"] == messages
        assert last_request(logs)["count_source"] == "provider"


class TestVllmTokenize:
    async def test_counted_locally_in_front_of_vllm_the_edge_asks_its_tokenize_for_the_conversation(
        self, aiohttp_server: Any, start_proxy: Proxy, logs: Logs
    ) -> None:
        """With `tokenize: local` the guard bounds a model whose vocabulary ships in no package (Gemma 3n);
        at the edge, vLLM's `/tokenize` renders and counts."""
        fake = CountingUpstream(answer=1650)
        proxy, _ = await start(aiohttp_server, start_proxy, fake, "vllm", tokenize="local")
        messages = conversation(1800)
        body = {"model": "google/gemma-3n-E4B-it", "max_tokens": 100, "messages": messages}
        status, _ = await post(proxy, "/v1/chat/completions", body)
        assert status == 200
        path, counted, _ = fake.count_bodies[0]
        assert path == "/tokenize" and counted["messages"] == messages and counted["add_generation_prompt"] is True
        assert fake.sent[0]["messages"] == messages
        assert last_request(logs)["count_source"] == "provider"
