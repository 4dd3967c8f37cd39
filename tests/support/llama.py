"""A llama.cpp-like fake backend on a real loopback port, and a plain POST to the guard in front of it:
shared by the backend-answer, backend-planning and learned-parts tests."""

from __future__ import annotations

import asyncio
import json
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

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


async def post(proxy: Any, body: dict[str, Any]) -> tuple[int, bytes, dict[str, str]]:
    async with aiohttp.ClientSession() as session, session.post(proxy.make_url("/v1/chat/completions"), json=body) as r:
        return r.status, await r.read(), dict(r.headers)
