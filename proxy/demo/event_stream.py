"""The one writer of a streamed answer for every fake upstream (the echo, the suite's, the
client-compatibility suite's, the benchmark's): the frames of a stream (server-sent events, or a
JSON array's pieces) sent in order, with what a test or a benchmark may ask of the timing (a
pause between frames, a connection broken off half-way, an event set once the head is sent).

The frames are built before the answer starts (`proxy.demo.provider_answers.frames`), so writing
them costs one `write` each and nothing else: the benchmark's upstream, the baseline of its
ratios, sends its paced deltas through here too.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from aiohttp import web

SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


async def send_stream(
    request: web.Request,
    chunks: Sequence[bytes],
    *,
    pause: float = 0.0,
    break_after: int | None = None,
    started: asyncio.Event | None = None,
    headers: Mapping[str, str] = SSE_HEADERS,
) -> web.StreamResponse:
    """Send `chunks` `pause` seconds apart; with `break_after`, close the connection instead of
    sending that chunk (a crash half-way through). `started` is set once the answer's head is sent."""
    response = web.StreamResponse(headers=headers)
    await response.prepare(request)
    if started is not None:
        started.set()
    for i, chunk in enumerate(chunks):
        if i and pause:
            await asyncio.sleep(pause)
        if i == break_after:
            assert request.transport is not None  # a request being answered has its connection
            request.transport.close()
            return response
        await response.write(chunk)
    await response.write_eof()
    return response
