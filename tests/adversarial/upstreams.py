"""Misbehaving upstreams for the adversarial suite and bench/adversarial.py: real aiohttp apps.

- `endless_event_upstream(size)`: a chat stream with one SSE event of `size` bytes (`honest=True`:
  the same bytes as ordinary small events).
- `llama_server(tokenize)`: a llama-server that states its window and whose `/tokenize` hangs
  (`"hang"`), answers 16 MB (`"huge"`) or answers as it should (`"ok"`).

Run one as a process: `python -m tests.adversarial.upstreams PORT endless SIZE` (or `honest SIZE`,
`llama hang|huge|ok`).
"""

from __future__ import annotations

import asyncio
import json
import sys

from aiohttp import web

CHUNK = 64 * 1024
USAGE = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 1}}
ANSWER = {
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1},
}


def sse(payload: object) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


USAGE = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 1}}
ANSWER = {
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1},
}


def endless_event_upstream(size: int, honest: bool = False) -> web.Application:
    """Streams one ordinary delta, then one event of `size` bytes (or as many bytes of ordinary
    deltas), then usage and [DONE]."""

    async def chat(request: web.Request) -> web.StreamResponse:
        if not (await request.json()).get("stream"):  # a request that does not stream is answered plainly
            return web.json_response(ANSWER)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(sse({"choices": [{"index": 0, "delta": {"content": "hi"}}]}))
        if honest:
            delta = sse({"choices": [{"index": 0, "delta": {"content": "a" * 200}}]})
            chunk = delta * (CHUNK // len(delta))
            for _ in range(size // len(chunk)):
                await response.write(chunk)
            await response.write(sse(USAGE) + b"data: [DONE]\n\n")
        else:
            await response.write(b'data: {"choices": [{"index": 0, "delta": {"content": "')
            filler = b"a" * CHUNK
            for _ in range(size // CHUNK):
                await response.write(filler)
            await response.write(b'"}}]}\n\n' + sse(USAGE) + b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


TOKENIZE_CALLS = web.AppKey("tokenize_calls", list[bytes])


def llama_server(tokenize: str) -> web.Application:
    """A llama-server that states its window and whose `/tokenize` hangs (`hang`) or answers 16 MB
    (`huge`); `app[TOKENIZE_CALLS]` holds the body of every `/tokenize` call it received."""

    async def props(request: web.Request) -> web.Response:
        return web.json_response({"default_generation_settings": {"n_ctx": 8192}, "model_alias": "local"})

    async def tokenize_call(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        app[TOKENIZE_CALLS].append(body)
        if tokenize == "hang":
            await asyncio.sleep(3600)
        if tokenize == "ok":
            data = json.loads(body)
            return web.json_response({"tokens": [1] * max(1, len(str(data.get("content", ""))) // 4)})
        # 16 MB of token ids, written a chunk at a time as a remote server's bytes arrive: the
        # fake shares the guard's loop, and one 16 MB write would be the fake's work measured there.
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"tokens": [')
        ids = b"1," * (CHUNK // 2)
        for _ in range(8 * 1024 * 1024 // (CHUNK // 2)):
            await response.write(ids)
        await response.write(b"1]}")
        await response.write_eof()
        return response

    async def apply_template(request: web.Request) -> web.Response:
        data = await request.json()
        return web.json_response({"prompt": " ".join(str(m.get("content")) for m in data["messages"])})

    async def chat(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response(ANSWER)

    app = web.Application()
    app[TOKENIZE_CALLS] = []
    app.router.add_get("/props", props)
    app.router.add_post("/tokenize", tokenize_call)
    app.router.add_post("/apply-template", apply_template)
    app.router.add_post("/v1/chat/completions", chat)
    return app


if __name__ == "__main__":
    port, kind = int(sys.argv[1]), sys.argv[2]
    if kind in ("endless", "honest"):
        app = endless_event_upstream(int(sys.argv[3]), honest=kind == "honest")
    else:
        app = llama_server(sys.argv[3])
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)
