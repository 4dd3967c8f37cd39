"""A recording upstream for the client-compatibility suite: it keeps what reached it and answers in
each API's shape (chat, Responses, legacy completions, embeddings, Anthropic Messages), whole or
streamed, with text or with a scripted tool call, and can break a stream part-way.

It counts nothing with the guard's code: fit is checked by the tests with tiktoken directly.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text


@dataclass
class RecordingUpstream:
    received: list[Received] = field(default_factory=list)
    # Answers to give, in order (a ToolCall or a text); when empty, "ok" (or the call a forced
    # tool_choice names, with `forced_arguments`).
    script: list[ToolCall | str] = field(default_factory=list)
    forced_arguments: str = "{}"
    break_after: int | None = None  # close the connection after this many stream events

    def reset(self) -> None:
        self.received.clear()
        self.script.clear()
        self.forced_arguments, self.break_after = "{}", None

    @property
    def last(self) -> Received:
        return self.received[-1]

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body = json.loads(raw) if raw else {}
        self.received.append(Received(request.path, dict(request.headers), body))
        path = request.path.rstrip("/")
        answer = self._answer(body)
        if path.endswith("/embeddings"):
            return _embeddings(body)
        if path.endswith("/chat/completions"):
            return await self._chat(request, body, answer)
        if path.endswith("/responses"):
            return await self._responses(request, body, answer)
        if path.endswith("/completions"):
            return await self._completions(request, body, answer)
        if path.endswith("/messages"):
            return await self._messages(request, body, answer)
        return web.json_response({"error": {"message": f"no {path}", "type": "invalid_request_error"}}, status=404)

    def _answer(self, body: dict[str, Any]) -> ToolCall | str:
        if self.script:
            return self.script.pop(0)
        choice = body.get("tool_choice")
        if isinstance(choice, dict):
            name = choice.get("name") or (choice.get("function") or {}).get("name")
            if name:
                return ToolCall(name, self.forced_arguments)
        return "ok"

    async def _events(self, request: web.Request, events: list[bytes]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i, event in enumerate(events):
            if self.break_after is not None and i == self.break_after:
                assert request.transport is not None
                request.transport.close()  # a crash half-way through
                return response
            await response.write(event)
        await response.write_eof()
        return response

    async def _chat(self, request: web.Request, body: dict[str, Any], answer: ToolCall | str) -> web.StreamResponse:
        head = {"id": "chatcmpl-rec", "created": int(time.time()), "model": body.get("model")}
        usage = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
        if isinstance(answer, ToolCall):
            call = {
                "id": "call_rec",
                "type": "function",
                "function": {"name": answer.name, "arguments": answer.arguments},
            }
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish = "tool_calls"
        else:
            message, finish = {"role": "assistant", "content": answer}, "stop"
        if not body.get("stream"):
            choice = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
            return web.json_response({**head, "object": "chat.completion", "choices": [choice], "usage": usage})

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
            return _data({**head, "object": "chat.completion.chunk", "choices": [choice]})

        events = [chunk({"role": "assistant", "content": ""})]
        if isinstance(answer, ToolCall):
            events.append(chunk({"tool_calls": [{"index": 0, **message["tool_calls"][0]}]}))
        else:
            events += [chunk({"content": part}) for part in _parts(answer)]
        events += [chunk({}, finish), b"data: [DONE]\n\n"]
        return await self._events(request, events)

    async def _completions(
        self, request: web.Request, body: dict[str, Any], answer: ToolCall | str
    ) -> web.StreamResponse:
        text = answer if isinstance(answer, str) else answer.arguments
        head = {"id": "cmpl-rec", "object": "text_completion", "created": int(time.time()), "model": body.get("model")}
        if not body.get("stream"):
            choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": "stop"}
            usage = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
            return web.json_response({**head, "choices": [choice], "usage": usage})
        events = [
            _data({**head, "choices": [{"text": part, "index": 0, "logprobs": None, "finish_reason": None}]})
            for part in _parts(text)
        ]
        events += [_data({**head, "choices": [{"text": "", "index": 0, "finish_reason": "stop"}]}), b"data: [DONE]\n\n"]
        return await self._events(request, events)

    async def _responses(
        self, request: web.Request, body: dict[str, Any], answer: ToolCall | str
    ) -> web.StreamResponse:
        if isinstance(answer, ToolCall):
            item: dict[str, Any] = {
                "id": "fc_rec",
                "type": "function_call",
                "status": "completed",
                "call_id": f"call_rec{len(self.received)}",
                "name": answer.name,
                "arguments": answer.arguments,
            }
        else:
            part = {"type": "output_text", "text": answer, "annotations": []}
            item = {"id": "msg_rec", "type": "message", "status": "completed", "role": "assistant", "content": [part]}
        usage = {
            "input_tokens": 10,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 2,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 12,
        }

        def response(status: str, output: list[Any]) -> dict[str, Any]:
            return {
                "id": f"resp_rec{len(self.received)}",
                "object": "response",
                "created_at": int(time.time()),
                "status": status,
                "model": body.get("model"),
                "output": output,
                "parallel_tool_calls": True,
                "tool_choice": "auto",
                "tools": [],
                "error": None,
                "incomplete_details": None,
                "previous_response_id": body.get("previous_response_id"),
                "usage": usage if status == "completed" else None,
            }

        if not body.get("stream"):
            return web.json_response(response("completed", [item]))
        seq = iter(range(1000))

        def event(kind: str, **fields: Any) -> bytes:
            return _data({"type": kind, "sequence_number": next(seq), **fields}, kind)

        events = [event("response.created", response=response("in_progress", []))]
        if item["type"] == "message":
            text = item["content"][0]["text"]
            where = {"item_id": item["id"], "output_index": 0, "content_index": 0}
            events.append(event("response.output_item.added", output_index=0, item={**item, "content": []}))
            events.append(event("response.content_part.added", **where, part={**item["content"][0], "text": ""}))
            events += [event("response.output_text.delta", **where, delta=p, logprobs=[]) for p in _parts(text)]
            events.append(event("response.output_text.done", **where, text=text, logprobs=[]))
            events.append(event("response.content_part.done", **where, part=item["content"][0]))
        else:
            events.append(event("response.output_item.added", output_index=0, item={**item, "arguments": ""}))
            events.append(
                event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=0,
                    delta=item["arguments"],
                )
            )
            events.append(
                event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=0,
                    arguments=item["arguments"],
                )
            )
        events.append(event("response.output_item.done", output_index=0, item=item))
        events.append(event("response.completed", response=response("completed", [item])))
        return await self._events(request, events)

    async def _messages(self, request: web.Request, body: dict[str, Any], answer: ToolCall | str) -> web.StreamResponse:
        if isinstance(answer, ToolCall):
            block: dict[str, Any] = {
                "type": "tool_use",
                "id": f"toolu_rec{len(self.received)}",
                "name": answer.name,
                "input": json.loads(answer.arguments),
            }
            stop = "tool_use"
        else:
            block, stop = {"type": "text", "text": answer}, "end_turn"
        message = {
            "id": "msg_rec",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": [block],
            "stop_reason": stop,
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 2},
        }
        if not body.get("stream"):
            return web.json_response(message)
        events = [
            _data(
                {"type": "message_start", "message": {**message, "content": [], "stop_reason": None}}, "message_start"
            )
        ]
        if block["type"] == "text":
            start = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
            events.append(_data(start, "content_block_start"))
            for part in _parts(block["text"]):
                delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": part}}
                events.append(_data(delta, "content_block_delta"))
        else:
            start = {"type": "content_block_start", "index": 0, "content_block": {**block, "input": {}}}
            events.append(_data(start, "content_block_start"))
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
            events.append(_data({"type": "content_block_delta", "index": 0, "delta": delta}, "content_block_delta"))
        events.append(_data({"type": "content_block_stop", "index": 0}, "content_block_stop"))
        ending = {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": 2},
        }
        events += [_data(ending, "message_delta"), _data({"type": "message_stop"}, "message_stop")]
        return await self._events(request, events)


def _embeddings(body: dict[str, Any]) -> web.Response:
    inputs = body.get("input")
    items = inputs if isinstance(inputs, list) and inputs and not isinstance(inputs[0], int) else [inputs]
    if body.get("encoding_format") == "base64":
        import base64
        import struct

        vector: Any = base64.b64encode(struct.pack("<3f", 0.1, 0.2, 0.3)).decode()
    else:
        vector = [0.1, 0.2, 0.3]
    data = [{"object": "embedding", "index": i, "embedding": vector} for i in range(len(items))]
    usage = {"prompt_tokens": len(items), "total_tokens": len(items)}
    return web.json_response({"object": "list", "data": data, "model": body.get("model"), "usage": usage})


def _parts(text: str) -> list[str]:
    words = text.split(" ")
    return [w + (" " if i < len(words) - 1 else "") for i, w in enumerate(words)]


def _data(payload: dict[str, Any], name: str | None = None) -> bytes:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(payload)}\n\n".encode()
