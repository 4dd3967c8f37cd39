"""An upstream that speaks every API shape the guard counts, for tests with the official SDKs.

A real aiohttp app on 127.0.0.1 that records each request it receives (method, path, query,
headers, body bytes) and answers as the provider would, in JSON or as a server-sent event stream
when the body asks for `stream`:

    POST /v1/chat/completions, /openai/deployments/{d}/chat/completions   chat completion
    POST /v1/responses                                                    Response (message or function_call)
    POST /v1/completions, /openai/deployments/{d}/completions             text completion
    POST /v1/messages                                                     Anthropic message (text or tool_use)
    POST /v1/messages/count_tokens                                        {"input_tokens": ...}

When the request offers tools and is not already answering a call, the reply is a call of the
first tool, so an SDK test can run a whole tool loop. With `limit` set, a prompt whose body is
longer than `limit` tokens (at 4 bytes a token) is refused in the provider's own words.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.server.fake_upstream import Received


@dataclass
class FakeProviders:
    received: list[Received] = field(default_factory=list)
    reply_text: str = "Hello from upstream."
    limit: int | None = None  # refuse prompts over this many (body bytes / 4) tokens

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/openai/deployments/{deployment}/chat/completions", self.chat)
        app.router.add_post("/v1/responses", self.responses)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/openai/deployments/{deployment}/completions", self.completions)
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_post("/v1/messages/count_tokens", self.count_tokens)
        return app

    def last(self, path_end: str) -> Received:
        return next(r for r in reversed(self.received) if r.path.endswith(path_end))

    async def _record(self, request: web.Request) -> dict[str, Any]:
        received = Received(
            request.method, request.path, request.query_string, dict(request.headers), await request.read()
        )
        self.received.append(received)
        body = received.json()
        assert isinstance(body, dict)
        return body

    def _too_long(self, request_body: dict[str, Any]) -> int | None:
        tokens = len(json.dumps(request_body)) // 4
        return tokens if self.limit is not None and tokens > self.limit else None

    # -- OpenAI chat completions and legacy completions ---------------------------------------

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request)
        model = body.get("model") or request.match_info.get("deployment")
        if (tokens := self._too_long(body)) is not None:
            message = f"This model's maximum context length is {self.limit} tokens. However, your messages resulted in {tokens} tokens."
            error = {
                "message": message,
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
            return web.json_response({"error": error}, status=400)
        if body.get("stream"):
            chunks = [
                {
                    "id": "chatcmpl-1",
                    "object": "chat.completion.chunk",
                    "created": 1,
                    "model": model,
                    "choices": [{"index": 0, "delta": {"content": word + " "}, "finish_reason": None}],
                }
                for word in self.reply_text.split()
            ]
            return await _sse(request, [(None, c) for c in chunks], done=True)
        message = {"role": "assistant", "content": self.reply_text}
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 1,
                "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
            }
        )

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request)
        choice = {"text": " " + self.reply_text, "index": 0, "logprobs": None, "finish_reason": "stop"}
        completion = {
            "id": "cmpl-1",
            "object": "text_completion",
            "created": 1,
            "model": body.get("model") or request.match_info.get("deployment"),
            "choices": [choice],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
        }
        if body.get("stream"):
            return await _sse(request, [(None, completion)], done=True)
        return web.json_response(completion)

    # -- OpenAI Responses ---------------------------------------------------------------------

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request)
        items = body.get("input") if isinstance(body.get("input"), list) else []
        answering = bool(items) and isinstance(items[-1], dict) and items[-1].get("type") == "function_call_output"
        tools = [t for t in body.get("tools") or () if t.get("type") == "function"]
        if tools and not answering:
            item: dict[str, Any] = {
                "type": "function_call",
                "id": "fc_1",
                "call_id": "call_1",
                "name": tools[0]["name"],
                "arguments": '{"q": "weather"}',
                "status": "completed",
            }
        else:
            text = {"type": "output_text", "text": self.reply_text, "annotations": []}
            item = {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant", "content": [text]}
        response = {
            "id": "resp_1",
            "object": "response",
            "created_at": 1,
            "status": "completed",
            "model": body.get("model"),
            "output": [item],
            "parallel_tool_calls": True,
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools", []),
            "usage": {
                "input_tokens": 10,
                "output_tokens": 3,
                "total_tokens": 13,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }
        if not body.get("stream"):
            return web.json_response(response)
        started = {**response, "status": "in_progress", "output": []}
        events: list[tuple[str | None, dict[str, Any]]] = [
            ("response.created", {"type": "response.created", "response": started}),
            ("response.output_item.added", {"type": "response.output_item.added", "output_index": 0, "item": item}),
        ]
        if item["type"] == "message":
            delta = {
                "type": "response.output_text.delta",
                "item_id": "msg_1",
                "output_index": 0,
                "content_index": 0,
                "delta": self.reply_text,
                "logprobs": [],
            }
            events.append(("response.output_text.delta", delta))
        events += [
            ("response.output_item.done", {"type": "response.output_item.done", "output_index": 0, "item": item}),
            ("response.completed", {"type": "response.completed", "response": response}),
        ]
        for n, (_, event) in enumerate(events):
            event["sequence_number"] = n
        return await _sse(request, events)

    # -- Anthropic Messages -------------------------------------------------------------------

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request)
        if (tokens := self._too_long(body)) is not None:
            error = {
                "type": "invalid_request_error",
                "message": f"prompt is too long: {tokens} tokens > {self.limit} maximum",
            }
            return web.json_response({"type": "error", "error": error}, status=400)
        last = body["messages"][-1]
        answering = isinstance(last.get("content"), list) and any(
            b.get("type") == "tool_result" for b in last["content"]
        )
        tools = body.get("tools") or []
        if tools and not answering:
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": "toolu_1",
                "name": tools[0]["name"],
                "input": {"q": "weather"},
            }
            stop = "tool_use"
        else:
            block, stop = {"type": "text", "text": self.reply_text}, "end_turn"
        usage = {"input_tokens": 10, "output_tokens": 3}
        message = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": [block],
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": usage,
        }
        if not body.get("stream"):
            return web.json_response(message)
        if block["type"] == "text":
            opening, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": self.reply_text}
        else:
            opening = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        events: list[tuple[str | None, dict[str, Any]]] = [
            ("message_start", {"type": "message_start", "message": {**message, "content": [], "stop_reason": None}}),
            ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": opening}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop, "stop_sequence": None},
                    "usage": {"output_tokens": 3},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
        return await _sse(request, events)

    async def count_tokens(self, request: web.Request) -> web.StreamResponse:
        body = await self._record(request)
        return web.json_response({"input_tokens": len(json.dumps(body)) // 4})


async def _sse(
    request: web.Request, events: list[tuple[str | None, dict[str, Any]]], done: bool = False
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for name, data in events:
        head = f"event: {name}\n" if name else ""
        await response.write(f"{head}data: {json.dumps(data)}\n\n".encode())
    if done:
        await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
