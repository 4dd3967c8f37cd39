"""An OpenAI-compatible upstream for tests: a real aiohttp app that records what it receives.

It answers chat completions (JSON, or SSE when `stream` is set), echoes every other path, and
can be told to misbehave: stall, break a stream half-way, or reject prompts over a limit in the
words of OpenAI, vLLM, Vertex AI or llama.cpp. It counts a prompt by OpenAI's cookbook rule with
tiktoken directly, never with the guard's counter, times `provider_factor` (a provider counting
higher than the guard).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import math
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.support.cookbook import cookbook_count


@dataclass
class Received:
    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    raw_query: str = ""  # as it came on the wire, still percent-encoded

    def json(self) -> Any:
        return json.loads(self.body)


def overflow_error(style: str, limit: int, prompt: int) -> tuple[int, dict[str, Any]]:
    if style == "openai":
        message = (
            f"This model's maximum context length is {limit} tokens. However, your messages resulted in "
            f"{prompt} tokens. Please reduce the length of the messages."
        )
        return 400, {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        }
    if style == "vllm":
        message = (
            f"This model's maximum context length is {limit} tokens. However, you requested {prompt + 100} "
            f"tokens ({prompt} in the messages, 100 in the completion). Please reduce the length of the messages or completion."
        )
        return 400, {"object": "error", "message": message, "type": "BadRequestError", "param": None, "code": 400}
    if style == "vertex":
        message = f"The input token count ({prompt}) exceeds the maximum number of tokens allowed ({limit})."
        return 400, [{"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}]  # type: ignore[return-value]
    if style == "llamacpp":
        return 400, {
            "error": {
                "code": 400,
                "message": "the request exceeds the available context size, try increasing it",
                "type": "exceed_context_size_error",
                "n_prompt_tokens": prompt,
                "n_ctx": limit,
            }
        }
    raise ValueError(style)


@dataclass
class FakeUpstream:
    received: list[Received] = field(default_factory=list)
    reply_text: str = "Hello from upstream."
    delay: float = 0.0  # before answering
    chunk_delay: float = 0.0  # between stream chunks
    stream_chunks: int = 5
    break_stream_after: int | None = None  # close the connection after this many chunks
    # Reject prompts whose count (ours x provider_factor) exceeds `limit`, in this provider's words.
    limit: int | None = None
    provider_factor: float = 1.25
    error_style: str = "openai"
    renders_field: str | None = None  # count the texts of this body field too, as a server's own extension might
    fail_with: tuple[int, dict[str, Any]] | None = None  # answer every chat request with this error
    echo_field: str | None = None  # answer 400 starting with this body field's value, as upstreams echo input
    gzip_errors: bool = False  # compress error bodies when the client accepts gzip, as OpenAI does
    stream_cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    stream_started: asyncio.Event = field(default_factory=asyncio.Event)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_route("*", "/{tail:.*}", self.echo)
        return app

    async def _record(self, request: web.Request) -> Received:
        received = Received(
            request.method,
            request.path,
            request.query_string,
            dict(request.headers),
            await request.read(),
            request.rel_url.raw_query_string,
        )
        self.received.append(received)
        return received

    def provider_count(self, body: dict[str, Any]) -> int:
        """The provider's count of `body`: the cookbook's rule with tiktoken directly
        (`tests.support.cookbook.cookbook_count`), times `provider_factor`. It shares no code with
        the guard's counter, so a guard that counts wrong is caught: a forwarded body the guard
        under-counts is refused here. (This fake once counted with the guard's own `RequestCounter`,
        which would have agreed with any error in it.)"""
        extra = [str(d.get("text", "")) for d in body.get(self.renders_field, ())] if self.renders_field else []
        return math.ceil(cookbook_count(body, extra) * self.provider_factor)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        received = await self._record(request)
        body = received.json()
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail_with is not None:
            return web.json_response(self.fail_with[1], status=self.fail_with[0], headers={"retry-after": "7"})
        if self.echo_field is not None:
            message = f"{body.get(self.echo_field)} is not a valid value for '{self.echo_field}'."
            error = {"message": message, "type": "invalid_request_error", "param": self.echo_field, "code": None}
            return web.json_response({"error": error}, status=400)
        if self.limit is not None:
            prompt = self.provider_count(body)
            if prompt > self.limit:
                status, error = overflow_error(self.error_style, self.limit, prompt)
                if self.gzip_errors and "gzip" in request.headers.get("Accept-Encoding", ""):
                    body = gzip.compress(json.dumps(error).encode())
                    return web.Response(
                        body=body,
                        status=status,
                        headers={"Content-Encoding": "gzip", "Content-Type": "application/json"},
                    )
                return web.json_response(error, status=status)
        if body.get("stream"):
            return await self._stream(request, body)
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 1,
                "model": body.get("model"),
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": self.reply_text}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
            },
            headers={"x-upstream": "fake"},
        )

    async def _stream(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "x-upstream": "fake"})
        await response.prepare(request)
        self.stream_started.set()
        try:
            for i in range(self.stream_chunks):
                if self.break_stream_after is not None and i == self.break_stream_after:
                    assert request.transport is not None
                    request.transport.close()  # a crash half-way through
                    return response
                chunk = {
                    "id": "chatcmpl-1",
                    "object": "chat.completion.chunk",
                    "created": 1,
                    "model": body.get("model"),
                    "choices": [{"index": 0, "delta": {"content": f"part{i} "}, "finish_reason": None}],
                }
                await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
                if self.chunk_delay:
                    await asyncio.sleep(self.chunk_delay)
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
        except (asyncio.CancelledError, ConnectionResetError):
            self.stream_cancelled.set()
            raise
        return response

    async def echo(self, request: web.Request) -> web.StreamResponse:
        received = await self._record(request)
        if self.delay:
            await asyncio.sleep(self.delay)
        return web.Response(
            body=received.body or b"{}",
            content_type=request.content_type if received.body else "application/json",
            headers={"x-echo-path": request.path, "x-echo-query": request.query_string},
        )
