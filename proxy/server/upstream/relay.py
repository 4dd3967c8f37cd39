"""An upstream's answer: how its stream began, read before committing; relayed to the client chunk by
chunk as it arrives, compressed bytes and all, and read for its usage on the way; and what the guard
changes in a streamed request before sending it.

- `first_event()` / `peek_first_event()`: some servers send `200` and then nothing (llama-cpp-python
  on an over-window stream), or `200` and then an error event. The first complete server-sent
  event (or the first bytes of any other body) says which it is: data, an error, or an empty body.
  Until the client's response is prepared, the handler can still retry or answer an error; the
  bytes read are relayed first. The event parsing here (`event_end`, `event_data`, `may_name`) is
  also what the usage tap reads a relayed stream with (`proxy.server.upstream.usage`).
- `UsageReader`: the usage the upstream reports in any API's spelling, and what it says it now
  holds (a stored response, a conversation, a cache), from a stream's events or the body of a whole
  answer: the record shows the provider's count beside the guard's, an estimate calibrates from it,
  the ledger of held context learns from it. A usage chunk the guard asked for on the client's
  behalf is taken out of what the client sees. It also knows when the client has had the whole
  answer (a stream's `[DONE]`, a body's last byte): a client that leaves after that has been
  answered, not cut off.
- `relay()`: an upstream body that ends before its announced length aborts the client's
  connection, so the client sees a broken response instead of waiting forever; a broken event
  stream ends with the error event of the client's API shape (its adapter's `broken_stream_event`).
- `ask_for_usage()` adds `stream_options.include_usage` to a stream that did not ask for its usage,
  so the upstream's count can calibrate the guard's (the usage chunk is then taken out of what the
  client sees: `proxy.server.upstream.usage.UsageTap`); `overflow_probe()` is what is sent instead
  when a stream came back empty from a server that answers an over-window stream that way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
from aiohttp import web

from proxy.apis.base import AnswerAmendment
from proxy.apis.stream_errors import StreamFraming, openai_broken
from proxy.server.edge.body import Decoder
from proxy.server.edge.paths import PATH_ROUTE
from proxy.server.request.flow import Flow
from proxy.server.upstream.connection import response_headers
from proxy.server.upstream.usage import (
    FramedTap,
    Reported,
    Spelling,
    Usage,
    UsageTap,
    event_data,
    event_end,
    json_or_none,
    may_name,
    reported_from_body,
)


def ask_for_usage(body: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """`body` with `stream_options.include_usage` set when it streams and did not ask for usage;
    and whether it was added (so the usage chunk is stripped from what the client sees)."""
    if body.get("stream") is not True:
        return dict(body), False
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        return dict(body), False  # malformed: the upstream answers it, as the client sent it
    if options and "include_usage" in options:
        return dict(body), False
    return {**body, "stream_options": {**(options or {}), "include_usage": True}}, True


def overflow_probe(body: Mapping[str, Any]) -> dict[str, Any]:
    """What to send when a stream came back empty from a server that answers an over-window
    stream that way (llama-cpp-python): the same prompt, not streamed, for one token. An
    overflow is refused before any generation, and this time the error says the window and
    the server's count, so the guard can self-correct as for any other overflow."""
    probe = {k: v for k, v in body.items() if k not in ("stream", "stream_options", "max_completion_tokens")}
    return {**probe, "max_tokens": 1}


MAX_PEEK_BYTES = 256 * 1024  # a first event larger than this is relayed as data, unread

FirstKind = Literal["data", "error", "empty"]


@dataclass(frozen=True, slots=True)
class FirstEvent:
    """What an upstream response began with. `head` holds every byte read, as received."""

    kind: FirstKind
    head: bytes
    error: Mapping[str, Any] | None = None  # the error object of an error event

    @property
    def message(self) -> str:
        """The error's message, or a sentence saying the body was empty."""
        if self.kind == "empty":
            return "the upstream answered with an empty body"
        message = self.error.get("message") if self.error else None
        return message if isinstance(message, str) else "the upstream's stream began with an error event"


def is_event_stream(response: aiohttp.ClientResponse) -> bool:
    return response.headers.get("Content-Type", "").startswith("text/event-stream")


async def peek_first_event(response: aiohttp.ClientResponse, max_bytes: int = MAX_PEEK_BYTES) -> FirstEvent:
    """Read `response` up to its first SSE event with data (skipping comments such as keep-alive
    pings), or, for any other body, its first bytes; and classify it. aiohttp's errors pass through."""
    decode = Decoder(response.headers.get("Content-Encoding"))
    stream = is_event_stream(response)
    head = bytearray()
    text = bytearray()
    start = searched = 0  # where the next event starts; how far terminators were looked for
    while len(head) < max_bytes and len(text) < max_bytes:
        chunk = await response.content.readany()
        if not chunk:
            break
        head += chunk
        text += decode(chunk, max_bytes - len(text) + 1)
        if not stream:
            return _classify_body(bytes(head), bytes(text))
        while True:  # each byte is looked at once, whatever the chunks' sizes
            end, size = event_end(text, max(start, searched - 3))
            if end < 0:
                break
            event = bytes(text[start:end])
            start = end + size
            data = event_data(event)
            if data is not None:
                return _classify_event(bytes(head), event, data)
        searched = len(text)
    if not text.strip():
        return FirstEvent("empty", bytes(head))
    if stream:
        # The body ended (or grew too long) before a complete event: classify what there is.
        data = event_data(bytes(text))
        if data is not None and _error_of(data) is not None:
            return _classify_event(bytes(head), bytes(text), data)
    return FirstEvent("data", bytes(head))


def _classify_body(head: bytes, text: bytes) -> FirstEvent:
    return FirstEvent("data", head) if text.strip() else FirstEvent("empty", head)


def _classify_event(head: bytes, event: bytes, data: bytes) -> FirstEvent:
    error = _error_of(data)
    if error is None and _event_name(event) == "error":
        error = {"message": data.decode("utf-8", "replace")}
    return FirstEvent("error", head, error) if error is not None else FirstEvent("data", head)


def _event_name(event: bytes) -> str | None:
    for line in event.splitlines():
        if line.startswith(b"event:"):
            return line[6:].strip().decode("utf-8", "replace")
    return None


def _error_of(data: bytes) -> Mapping[str, Any] | None:
    if not may_name(data, b"error"):
        return None
    payload = json_or_none(data)
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict):
        return error
    if isinstance(error, str):
        return {"message": error}
    return None


MAX_USAGE_BODY = 4 * 1024 * 1024  # a whole answer larger than this is relayed unread
PARSE_ON_LOOP_BYTES = 64 * 1024  # a whole answer larger than this is read for its usage in a thread
YIELD_EVERY = 0.002  # seconds a relay may hold the loop before it lets the other requests run


async def first_event(
    response: aiohttp.ClientResponse, streaming: bool, framing: StreamFraming | None = None
) -> FirstEvent | None:
    """The first event of a streamed answer (read, not yet relayed); None for a whole answer, or a
    stream in its shape's own framing (read as it is relayed)."""
    if not streaming or framing is not None:
        return None
    return await peek_first_event(response)


def error_body(first: FirstEvent) -> bytes:
    """An answer that began with an error event or with nothing, as the error body it amounts to."""
    error = dict(first.error) if first.error else {"message": first.message, "type": "upstream_error"}
    return json.dumps({"error": error}).encode()


class UsageReader:
    """Relays an answer's bytes and keeps the usage it reports (`framing`: a stream's own, its shape's)."""

    def __init__(
        self,
        response: aiohttp.ClientResponse,
        strip: bool,
        framing: StreamFraming | None = None,
        spelled: Spelling | None = None,
    ) -> None:
        self.encoding, self.spelled = response.headers.get("Content-Encoding"), spelled
        self.stream = framing is not None or is_event_stream(response)
        self._tap: UsageTap | FramedTap | None = None
        if self.stream:
            self._tap = UsageTap(strip, self.encoding, spelled) if framing is None else FramedTap(framing, spelled)
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
                self._whole = await asyncio.to_thread(reported_from_body, body, self.encoding, self.spelled)
            else:
                self._whole = reported_from_body(body, self.encoding, self.spelled)
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


@dataclass
class Relayed:
    response: web.StreamResponse
    broken: str | None = None  # why the upstream stream ended early, if it did
    client_gone: bool = False


async def relay(
    flow: Flow,
    response: aiohttp.ClientResponse,
    extra_headers: Mapping[str, str],
    chunks: AsyncIterator[bytes] | None = None,
) -> Relayed:
    """Stream `response` to `flow`'s client as it arrives (or `chunks`, when given: its body, already
    begun or filtered; see `proxy.server.upstream.relay`). A client that goes away ends the relay
    (and, by leaving the upstream call, closes the upstream connection). An upstream that breaks
    mid-stream ends an event stream cleanly, with an SSE error event (in the grammar of the
    client's API, the flow record's `kind`) then EOF; any other body
    (or an event stream of announced length) is cut off by closing the client's connection, so
    that a half response can never pass for a whole one."""
    # The headers go out with the first bytes (one write, not two) unless this is an event stream
    # relayed from its very start: then they are sent at once, as the upstream sent its own.
    eager = chunks is None and is_event_stream(response)
    out = (web.StreamResponse if eager else _HeadersWithFirstBytes)(status=response.status, reason=response.reason)
    out.headers.update(response_headers(response.headers))
    out.headers.update(extra_headers)
    amendment = _amendment(flow, response)
    if response.content_length is not None and amendment is None:  # a whole body keeps its length; streams stay chunked
        out.content_length = response.content_length
    request = flow.request
    await out.prepare(request)
    relayed = Relayed(out)
    source = response.content.iter_any() if chunks is None else chunks
    try:
        async for chunk in source if amendment is None else _amended(source, amendment):
            await out.write(chunk)
    except ConnectionResetError:
        relayed.client_gone = True
        return relayed
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        relayed.broken = f"upstream {flow.target.upstream.name!r} ended the stream early ({type(exc).__name__})"
        endpoint = request[PATH_ROUTE].endpoint  # a pass-through path has none: OpenAI's event
        content_type = response.headers.get("Content-Type", "")
        framed = endpoint is not None and endpoint.adapter.stream_framing(content_type) is not None
        if not (framed or is_event_stream(response)) or out.content_length is not None:
            abort(request)
            return relayed
        event = (endpoint.adapter.broken_stream_event if endpoint else openai_broken)(relayed.broken)
        with contextlib.suppress(ConnectionResetError):
            await out.write(event)
    with contextlib.suppress(ConnectionResetError):
        await out.write_eof()
    return relayed


def _amendment(flow: Flow, response: aiohttp.ClientResponse) -> AnswerAmendment | None:
    """What writes into a successful answer the fields the guard adds to it (what its own context
    edits cleared, for an upstream that cannot edit: `Plan.answer`), in the client's API's shape;
    None when it adds none. A compressed answer is relayed as it came."""
    exchange = flow.exchange
    plan = exchange.plan if exchange is not None else None
    if plan is None or not plan.answer or response.status >= 400:
        return None
    if response.headers.get("Content-Encoding", "identity").lower() != "identity":
        return None
    return flow.endpoint.adapter.answer_amendment(plan.answer, is_event_stream(response))


async def _amended(chunks: AsyncIterator[bytes], amendment: AnswerAmendment) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        out = amendment.feed(chunk)
        if out:
            yield out
    rest = amendment.finish()
    if rest:
        yield rest


class _HeadersWithFirstBytes(web.StreamResponse):
    """A relayed response whose status line and headers are written together with its first body
    bytes, as aiohttp's own `web.Response` does (its `_send_headers_immediately`): on loopback
    each write costs a system call and the receiver's wake-up. A body that never comes still
    gets its headers, with the end of the response."""

    _send_headers_immediately = False


def abort(request: web.Request) -> None:
    """Close the client's connection now, mid-response: the client sees a truncated body."""
    request.protocol.force_close()
    if request.transport is not None:
        request.transport.close()
