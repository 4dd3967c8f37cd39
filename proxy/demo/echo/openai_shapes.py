"""The echo's answers in OpenAI's older shapes: chat completions, legacy completions, embeddings.

The answers are built by `proxy.demo.provider_answers`, as every fake upstream builds them, with
the echo's report added as the `echo` field. Streams follow OpenAI's: one chunk per few words, the
report on the chunk with the finish reason, a `usage` chunk when `stream_options.include_usage` is
set (and `"usage": null` on the others), then `data: [DONE]`.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from proxy.demo import provider_answers as answers
from proxy.demo.echo.report import Reply
from proxy.demo.event_stream import send_stream
from proxy.errors import BadRequest

EMBEDDING_DIMENSIONS = 16


def wants_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, Mapping) and options.get("include_usage") is True


async def chat(request: web.Request, body: Mapping[str, Any], reply: Reply) -> web.StreamResponse:
    ids, created = f"echo-{reply.suffix}", reply.created
    if body.get("stream") is not True:
        answer = answers.chat_completion(
            reply.model, reply.text, ids=ids, created=created, usage=reply.usage, logprobs=True
        )
        return web.json_response({**answer, "echo": reply.echo})
    usage = reply.usage if wants_usage(body) else None
    chunks = answers.chat_chunks(
        reply.model, reply.text, pieces=reply.pieces, framed=True, ids=ids, created=created, logprobs=True, usage=usage
    )
    _, last = chunks[-2 if usage is not None else -1]
    last["echo"] = reply.echo  # on the chunk with the finish reason
    return await send_stream(request, answers.frames(chunks, done=True))


async def completions(request: web.Request, body: Mapping[str, Any], reply: Reply) -> web.StreamResponse:
    ids, created = f"echo-{reply.suffix}", reply.created
    if body.get("stream") is not True:
        answer = answers.text_completion(reply.model, reply.text, ids=ids, created=created, usage=reply.usage)
        return web.json_response({**answer, "echo": reply.echo})
    usage = reply.usage if wants_usage(body) else None
    chunks = answers.text_completion_chunks(reply.model, reply.pieces, ids=ids, created=created, usage=usage)
    _, last = chunks[-2 if usage is not None else -1]
    last["echo"] = reply.echo  # on the chunk with the finish reason
    return await send_stream(request, answers.frames(chunks, done=True))


def embeddings(body: Mapping[str, Any], count: Callable[[str], int]) -> web.Response:
    """A deterministic vector per input (a hash of its text), as floats or as base64 float32s (what
    the openai SDK asks for); `count(text)` gives the tokens of one input."""
    inputs = answers.embedding_inputs(body.get("input"))
    if inputs is None:
        raise BadRequest("'input' must be a string, an array of strings or an array of token arrays", param="input")
    dimensions = body.get("dimensions")
    size = dimensions if isinstance(dimensions, int) and 0 < dimensions <= 4096 else EMBEDDING_DIMENSIONS
    texts = [item if isinstance(item, str) else " ".join(map(str, item)) for item in inputs]
    tokens = sum(count(item) if isinstance(item, str) else len(item) for item in inputs)
    vectors = [_vector(text, size) for text in texts]
    as_base64 = body.get("encoding_format") == "base64"
    answer = answers.embeddings(str(body.get("model") or "echo"), vectors, tokens=tokens, as_base64=as_base64)
    return web.json_response({**answer, "created": int(time.time())})


def _vector(text: str, size: int) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    while len(digest) < size:
        digest += hashlib.sha256(digest).digest()
    return [round((b - 127.5) / 127.5, 6) for b in digest[:size]]
