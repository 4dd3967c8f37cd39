"""The echo's answers in OpenAI's older shapes: chat completions, legacy completions, embeddings.

Streams follow OpenAI's: one chunk per few words, the report (`echo`) on the last content chunk,
a `usage` chunk when `stream_options.include_usage` is set (and `"usage": null` on the others),
then `data: [DONE]`.
"""

from __future__ import annotations

import base64
import hashlib
import struct
import time
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from proxy.demo.echo.report import pieces
from proxy.demo.echo.sse_writer import Reply, event, open_stream
from proxy.errors import BadRequest

EMBEDDING_DIMENSIONS = 16


def usage(reply: Reply) -> dict[str, int]:
    total = reply.prompt_tokens + reply.completion_tokens
    return {"prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens, "total_tokens": total}


def wants_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, Mapping) and options.get("include_usage") is True


async def chat(request: web.Request, body: Mapping[str, Any], reply: Reply) -> web.StreamResponse:
    head = {"id": f"chatcmpl-echo-{reply.suffix}", "created": reply.created, "model": reply.model}
    if body.get("stream") is not True:
        message = {"role": "assistant", "content": reply.text, "refusal": None}
        choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
        answer = {**head, "object": "chat.completion", "choices": [choice], "usage": usage(reply)}
        return web.json_response({**answer, "echo": reply.report.to_dict()})
    with_usage = wants_usage(body)
    extra = {"usage": None} if with_usage else {}

    def chunk(delta: dict[str, Any], finish: str | None = None, **more: Any) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return event({**head, "object": "chat.completion.chunk", "choices": [choice], **extra, **more})

    response = await open_stream(request)
    await response.write(chunk({"role": "assistant", "content": ""}))
    for piece in pieces(reply.text):
        await response.write(chunk({"content": piece}))
    await response.write(chunk({}, "stop", echo=reply.report.to_dict()))
    if with_usage:
        await response.write(event({**head, "object": "chat.completion.chunk", "choices": [], "usage": usage(reply)}))
    await response.write(event("[DONE]"))
    await response.write_eof()
    return response


async def completions(request: web.Request, body: Mapping[str, Any], reply: Reply) -> web.StreamResponse:
    head = {"id": f"cmpl-echo-{reply.suffix}", "object": "text_completion", "created": reply.created}
    head["model"] = reply.model

    def choice(text: str, finish: str | None) -> dict[str, Any]:
        return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}

    if body.get("stream") is not True:
        answer = {**head, "choices": [choice(reply.text, "stop")], "usage": usage(reply)}
        return web.json_response({**answer, "echo": reply.report.to_dict()})
    response = await open_stream(request)
    for piece in pieces(reply.text):
        await response.write(event({**head, "choices": [choice(piece, None)]}))
    await response.write(event({**head, "choices": [choice("", "stop")], "echo": reply.report.to_dict()}))
    if wants_usage(body):
        await response.write(event({**head, "choices": [], "usage": usage(reply)}))
    await response.write(event("[DONE]"))
    await response.write_eof()
    return response


def embeddings(body: Mapping[str, Any], count: Any) -> web.Response:
    """A deterministic vector per input (a hash of its text), as floats or as base64 float32s (what
    the openai SDK asks for); `count(text)` gives the tokens of one input."""
    model = str(body.get("model") or "echo")
    inputs = _inputs(body.get("input"))
    dimensions = body.get("dimensions")
    size = dimensions if isinstance(dimensions, int) and 0 < dimensions <= 4096 else EMBEDDING_DIMENSIONS
    as_base64 = body.get("encoding_format") == "base64"
    data, tokens = [], 0
    for index, item in enumerate(inputs):
        text = item if isinstance(item, str) else " ".join(map(str, item))
        tokens += count(text) if isinstance(item, str) else len(item)
        vector = _vector(text, size)
        encoded: Any = base64.b64encode(struct.pack(f"<{size}f", *vector)).decode() if as_base64 else vector
        data.append({"object": "embedding", "index": index, "embedding": encoded})
    answer = {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }
    return web.json_response({**answer, "created": int(time.time())})


def _inputs(value: object) -> Sequence[str | Sequence[int]]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, int) for v in value):
        return [value]  # one input as token ids
    if isinstance(value, list) and value and all(isinstance(v, (str, list)) for v in value):
        return value
    raise BadRequest("'input' must be a string, an array of strings or an array of token arrays", param="input")


def _vector(text: str, size: int) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    while len(digest) < size:
        digest += hashlib.sha256(digest).digest()
    return [round((b - 127.5) / 127.5, 6) for b in digest[:size]]
