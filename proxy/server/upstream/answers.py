"""Reading an upstream's answer as it is relayed, without changing a byte the client asked for.

Two things the handler needs from an answer with a success status:
- `first_event()`: how a stream began. A server may send the status line and then nothing (an
  over-window stream on llama-cpp-python) or an error event; the client's response is not
  committed until the first event is known, so those are handled like an error status.
- `UsageReader`: the usage the upstream reports in any API's spelling, and what it says it now
  holds (a stored response, a conversation, a cache: `proxy.server.upstream.usage`), from a
  stream's events or the body of a whole answer: the record shows the provider's count beside the
  guard's, an estimate calibrates from it, the ledger of held context learns from it. A usage chunk the guard asked for
  on the client's behalf is taken out of what the client sees. It also knows when the client has
  had the whole answer (a stream's `[DONE]`, a body's last byte): a client that leaves after
  that has been answered, not cut off.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import aiohttp

from proxy.server.bedrock.event_streams import EventStreamTap, is_aws_event_stream
from proxy.server.upstream.sse import FirstEvent, is_event_stream, peek_first_event
from proxy.server.upstream.usage import Reported, Usage, UsageTap, reported_from_body

MAX_USAGE_BODY = 4 * 1024 * 1024  # a whole answer larger than this is relayed unread
PARSE_ON_LOOP_BYTES = 64 * 1024  # a whole answer larger than this is read for its usage in a thread
YIELD_EVERY = 0.002  # seconds a relay may hold the loop before it lets the other requests run


async def first_event(response: aiohttp.ClientResponse, streaming: bool) -> FirstEvent | None:
    """The first event of a streamed answer (read, not yet relayed); None for a whole answer."""
    if not streaming or is_aws_event_stream(response):  # Bedrock's frames: read as they are relayed
        return None
    return await peek_first_event(response)


def error_body(first: FirstEvent) -> bytes:
    """An answer that began with an error event or with nothing, as the error body it amounts to."""
    error = dict(first.error) if first.error else {"message": first.message, "type": "upstream_error"}
    return json.dumps({"error": error}).encode()


class UsageReader:
    """Relays an answer's bytes and keeps the usage it reports."""

    def __init__(self, response: aiohttp.ClientResponse, strip: bool) -> None:
        self.encoding = response.headers.get("Content-Encoding")
        self.stream = is_event_stream(response)
        self._tap: UsageTap | EventStreamTap | None = UsageTap(strip, self.encoding) if self.stream else None
        if is_aws_event_stream(response):  # Bedrock's streams: whole frames relayed, each read
            self._tap = EventStreamTap(self.encoding)
        self._body = bytearray()
        self._unread = False  # the body grew past MAX_USAGE_BODY: no usage is read from it
        self._whole = Reported()
        self.delivered = False  # the client has been sent the whole answer

    @property
    def reported(self) -> Reported:
        return self._tap.reported if self._tap is not None else self._whole

    @property
    def usage(self) -> Usage | None:
        return self.reported.usage

    async def relayed(self, head: bytes, response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
        """`head` (bytes already read) and the rest of `response`, as they come."""
        # The relay asks for the next chunk only once it has written the last one: past a
        # `yield` of the chunk that ended the stream, the client has it.
        if head:
            for out in self._feed(head):
                yield out
                self.delivered = self._ended
        since = time.perf_counter()
        async for chunk in response.content.iter_any():
            for out in self._feed(chunk):
                yield out
                self.delivered = self._ended
            # A fast upstream always has the next chunk ready, and awaiting it then never hands the
            # loop back: every `YIELD_EVERY` seconds of relaying, the other requests get their turn.
            if time.perf_counter() - since > YIELD_EVERY:
                await asyncio.sleep(0)
                since = time.perf_counter()
        if self._tap is not None:
            rest = self._tap.finish()
            if rest:
                yield rest
        elif not self._unread:
            body = bytes(self._body)
            if len(body) > PARSE_ON_LOOP_BYTES:  # parsed in a thread: the loop serves others meanwhile
                self._whole = await asyncio.to_thread(reported_from_body, body, self.encoding)
            else:
                self._whole = reported_from_body(body, self.encoding)
        self.delivered = True

    @property
    def _ended(self) -> bool:
        return self._tap is not None and self._tap.ended

    def _feed(self, chunk: bytes) -> list[bytes]:
        if self._tap is not None:
            out = self._tap.feed(chunk)
            return [out] if out else []
        if not self._unread:
            self._body += chunk
            if len(self._body) > MAX_USAGE_BODY:  # relayed unread: what was kept is let go now
                self._body, self._unread = bytearray(), True
        return [chunk]
