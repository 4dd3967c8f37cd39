"""What the guard does with a backend's answers: an empty stream after the status line, and the
usage it reports (calibration), through the real app in front of an in-process llama.cpp-like fake."""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypeVar

import aiohttp
import pytest
from aiohttp import web

from tests.server.conftest import gateway_settings, long_conversation

Fake = TypeVar("Fake", bound="LlamaLike")
WINDOW = 3000  # the fake server's real window, far below the 8,192 the guard assumes for an unknown model


class LlamaLike:
    """Answers like llama-cpp-python: an over-window stream is a 200 with an empty body; the same
    request not streamed is a 400 with llama.cpp's structured overflow error. It reports usage as
    twice the guard's own estimate, as a model with a denser tokenizer would. Its chat template puts
    the texts of a request's `rag_context` (an extension of its own) in the prompt too."""

    window = WINDOW

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []
        self.linger = 0.0  # seconds a stream's connection stays open after [DONE]

    @staticmethod
    def count(body: dict[str, Any]) -> int:
        documents = sum(len(str(d.get("text", ""))) for d in body.get("rag_context", ()))
        return (sum(len(str(m.get("content", ""))) for m in body["messages"]) + documents) // 2

    def overflow(self, body: dict[str, Any], prompt: int) -> dict[str, Any]:
        return {"code": 400, "message": "exceeds the available context size", "type": "exceed_context_size_error",
                "n_prompt_tokens": prompt, "n_ctx": self.window}  # fmt: skip

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append(body)
        prompt = self.count(body)
        if prompt > self.window:
            if body.get("stream"):
                return web.Response(status=200)  # the status line, then nothing
            return web.json_response({"error": self.overflow(body, prompt)}, status=400)
        if body.get("stream"):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            chunk = {"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": None}]}
            await response.write(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())
            await asyncio.sleep(self.linger)
            return response
        usage = {"prompt_tokens": prompt, "completion_tokens": 1, "total_tokens": prompt + 1}
        choice = {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        return web.json_response({"choices": [choice], "usage": usage})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        return app


async def serve(aiohttp_server: Any, fake: Fake) -> tuple[Fake, str]:
    """`fake` started on a free loopback port, and its OpenAI base URL."""
    server = await aiohttp_server(fake.app())
    return fake, str(server.make_url("/v1"))


@pytest.fixture
async def llama(aiohttp_server: Any) -> tuple[LlamaLike, str]:
    return await serve(aiohttp_server, LlamaLike())


async def post(proxy: Any, body: dict[str, Any]) -> tuple[int, bytes, dict[str, str]]:
    async with aiohttp.ClientSession() as session, session.post(proxy.make_url("/v1/chat/completions"), json=body) as r:
        return r.status, await r.read(), dict(r.headers)


class TestAnEmptyStreamAfterTheStatusLine:
    async def test_is_probed_corrected_and_retried_before_the_client_sees_a_byte(self, start_proxy, llama, logs):
        fake, url = llama
        proxy = await start_proxy(gateway_settings(url, upstreams={"fake": {"base_url": url, "kind": "llamacpp"}}))
        status, body, _ = await post(proxy, {"model": "local-model", "messages": long_conversation(), "stream": True})
        assert status == 200 and b'"ok"' in body and b"[DONE]" in body
        streamed = [b for b in fake.received if b.get("stream")]
        assert len(streamed) == 2 and LlamaLike.count(streamed[-1]) <= WINDOW  # the retry fitted
        assert [b.get("max_tokens") for b in fake.received if not b.get("stream")] == [1]  # the probe
        event = logs.events("request")[-1]
        assert "empty_stream" in event["notes"] and event["self_correction"]["provider"] == "llamacpp"

    async def test_a_generic_upstream_s_empty_stream_is_a_proper_error_not_an_empty_200(
        self, start_proxy, llama, logs
    ):
        _, url = llama
        proxy = await start_proxy(gateway_settings(url))
        status, body, _ = await post(proxy, {"model": "local-model", "messages": long_conversation(), "stream": True})
        assert status == 502 and json.loads(body)["error"]["code"] == "upstream_unavailable"


class TestCalibrationFromUsage:
    async def test_an_estimate_learns_the_servers_count_and_is_scaled_by_it(self, start_proxy, llama, logs):
        _, url = llama
        proxy = await start_proxy(gateway_settings(url))
        short = [{"role": "user", "content": "tell me about rivers " * 40}]
        for _ in range(2):
            status, _, _ = await post(proxy, {"model": "local-model", "messages": short})
            assert status == 200
        first, second = logs.events("request")[-2:]
        assert first["count_source"] == "estimate" and first["provider_prompt_tokens"] > 0
        assert second["count_source"] == "calibrated" and second["calibration"] > 0
        assert abs(second["tokens_before"] - second["provider_prompt_tokens"]) <= 0.1 * second["provider_prompt_tokens"]

    async def test_a_request_with_a_field_the_guard_cannot_count_teaches_nothing(self, start_proxy, llama, logs):
        """Its usage is true, but about that request: one client's documents must not scale every
        other client's estimate."""
        _, url = llama
        proxy = await start_proxy(gateway_settings(url))
        short = [{"role": "user", "content": "tell me about rivers " * 40}]
        documents = [{"title": "notes", "text": "x" * 4000}]
        for body in ({"messages": short}, {"messages": short, "rag_context": documents}, {"messages": short}):
            assert (await post(proxy, {"model": "local-model", **body}))[0] == 200
        _, with_documents, after = logs.events("request")[-3:]
        # The same messages, counted as the first request taught: the documents taught nothing.
        assert after["count_source"] == "calibrated" and after["tokens_before"] == with_documents["tokens_before"]
        assert with_documents["provider_prompt_tokens"] > 2 * with_documents["tokens_before"]
        assert with_documents["unread_fields"] == ["rag_context"]
