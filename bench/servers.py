"""The servers the benchmark runs beside context-guard, each in its own process.

- `upstream PORT`: a fake LLM endpoint. `POST .../chat/completions` reads the whole body and
  answers one fixed completion. With `?deltas=N&gap_ms=G` it streams N SSE deltas G ms apart
  instead; with `?bytes=B` it streams B bytes of SSE data as fast as the client takes them.
  The query string, not the body, says what to do, so the upstream never parses a body and
  costs the same behind every proxy. The answer and the delta are built by
  `proxy.demo.provider_answers` (as every fake upstream's are) once, at import, and the stream is
  written by `proxy.demo.event_stream`: per request it only sends prepared bytes.
- `bare PORT UPSTREAM_URL`: the floor for an aiohttp design, a pass-through proxy that reads the
  body, forwards it with the client's headers, and streams the answer back chunk by chunk.
  No parsing, no counting, no logging. Configured as context-guard configures aiohttp (handler
  cancellation, no access log, one pooled client session without decompression).
- `minimal PORT UPSTREAM_URL`: the bare proxy plus the least any guard must do per request, whatever
  it counts: the body parsed (orjson; a guard must see the conversation), one JSON line written
  to standard output (the request's id, model, message count, status and duration, as a structlog
  `PrintLogger` writes it: flushed per line), one latency histogram observed (prometheus_client),
  and the collector tuned as context-guard tunes it. No routing, counting, caching or headers of
  its own: what context-guard costs beyond it is its own work, not what the design costs anyway.

Run: python bench/servers.py upstream 8001 | python bench/servers.py bare 8002 http://127.0.0.1:8001
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from proxy.demo import provider_answers as answers
from proxy.demo.event_stream import send_stream

CREATED = 1700000000
ANSWER = orjson.dumps(
    answers.chat_completion("gpt-4.1", "Fine.", ids="bench", created=CREATED, usage=answers.Usage(10, 2))
)
(DELTA,) = answers.frames(answers.chat_chunks("gpt-4.1", "word ", ids="bench", created=CREATED))
DONE = answers.DONE
LAST_DELTA = DELTA + DONE  # sent in one write: the stream ends with the last delta, not one gap after it
BULK_CHUNK = 64 * 1024
BULK_LINE = b"data: " + b"x" * (BULK_CHUNK - 8) + b"\n\n"
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer"}
    | {"transfer-encoding", "upgrade", "host", "content-length"}
)


async def completions(request: web.Request) -> web.StreamResponse:
    await request.read()
    deltas = int(request.query.get("deltas", 0))
    size = int(request.query.get("bytes", 0))
    if not deltas and not size:
        return web.Response(body=ANSWER, content_type="application/json")
    if deltas:
        gap = float(request.query.get("gap_ms", 0)) / 1000
        return await send_stream(request, [*[DELTA] * (deltas - 1), LAST_DELTA], pause=gap)
    return await send_stream(request, [*[BULK_LINE] * (size // BULK_CHUNK), DONE])


def upstream_app() -> web.Application:
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_get("/healthz", healthz)
    app.router.add_post("/{tail:.*}", completions)
    return app


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


def bare_app(upstream: str, minimal: bool = False) -> web.Application:
    """The bare proxy; with `minimal`, the minimal proxy (above)."""
    session_key = web.AppKey("session", aiohttp.ClientSession)
    seen = minimal_hook() if minimal else None

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=512, limit_per_host=0)
        async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
            app[session_key] = session
            yield

    async def forward(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        body = await request.read()
        parsed = orjson.loads(body) if seen is not None and body else None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        path = request.path.removeprefix("/v1")
        url = f"{upstream}{path}" + (f"?{request.query_string}" if request.query_string else "")
        async with request.app[session_key].request(request.method, url, data=body, headers=headers) as answer:
            response = web.StreamResponse(
                status=answer.status,
                headers={k: v for k, v in answer.headers.items() if k.lower() not in HOP_BY_HOP},
            )
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            if seen is not None:
                seen(parsed, answer.status, time.perf_counter() - started)
            return response

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.cleanup_ctx.append(session_ctx)
    app.router.add_get("/healthz", healthz)
    app.router.add_route("*", "/{tail:.*}", forward)
    return app


def minimal_hook() -> Callable[[Any, int, float], None]:
    """The minimal proxy's work per request, after its answer: one log line and one observation."""
    import prometheus_client

    from proxy.server.threads.collector import collect_young_less_often

    collect_young_less_often()  # as context-guard's serving process does
    registry = prometheus_client.CollectorRegistry()  # one per app: tests build several in one process
    seconds = prometheus_client.Histogram("minimal_request_seconds", "Seconds per request", registry=registry)
    ids = itertools.count()

    def seen(body: Any, status: int, elapsed: float) -> None:
        messages = body.get("messages") if isinstance(body, dict) else None
        line = {
            "request_id": f"{next(ids):016x}",
            "model": body.get("model") if isinstance(body, dict) else None,
            "messages": len(messages) if isinstance(messages, list) else 0,
            "status": status,
            "total_ms": round(elapsed * 1000, 2),
            "event": "request",
            "level": "info",
            "timestamp": time.time(),
        }
        print(orjson.dumps(line).decode(), flush=True)
        seconds.observe(elapsed)

    return seen


def main(argv: list[str]) -> None:
    kind, port = argv[0], int(argv[1])
    app = upstream_app() if kind == "upstream" else bare_app(argv[2].rstrip("/"), minimal=kind == "minimal")
    web.run_app(app, host="127.0.0.1", port=port, handler_cancellation=True, access_log=None, print=None)


if __name__ == "__main__":
    main(sys.argv[1:])
