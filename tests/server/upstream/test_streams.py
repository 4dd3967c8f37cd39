"""Upstream responses read before the client sees them: the first event, usage, stale connections.

Every upstream here is a real server on 127.0.0.1 in the test's loop: aiohttp apps for whole
responses and streams, and a raw asyncio server for connections that close under the client.
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.processes import free_port
from proxy.server.upstream.connection import is_stale_connection, send_retrying_stale
from proxy.server.upstream.relay import ask_for_usage, overflow_probe, peek_first_event
from proxy.server.upstream.usage import UsageTap, usage_from_body
from tests.server.conftest import gateway_settings
from tests.support.streams import replay, tapped

CHUNK = b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hi"}}]}\n\n'
USAGE_CHUNK = b'data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":42,"completion_tokens":2,"total_tokens":44}}\n\n'
DONE = b"data: [DONE]\n\n"


def sse_app(pieces: list[bytes], headers: dict[str, str] | None = None) -> web.Application:
    """An upstream that answers 200 with these pieces of an event stream, one write each."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", **(headers or {})})
        await response.prepare(request)
        for piece in pieces:
            await response.write(piece)
            await asyncio.sleep(0)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    return app


def body_app(body: bytes, content_type: str = "application/json", headers: dict[str, str] | None = None) -> web.Application:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=body, headers={"Content-Type": content_type, **(headers or {})})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    return app


@pytest.fixture
async def fetch(aiohttp_server: Any) -> AsyncIterator[Callable[..., Any]]:
    """Start an app and POST to it; yields (first event, the whole body as replayed)."""
    async with aiohttp.ClientSession(auto_decompress=False) as session:

        async def run(app: web.Application) -> tuple[Any, bytes]:
            server = await aiohttp_server(app)
            async with session.post(server.make_url("/v1/chat/completions"), data=b"{}") as response:
                first = await peek_first_event(response)
                whole = b"".join([chunk async for chunk in replay(first.head, response)])
            return first, whole

        yield run


class TestPeekFirstEvent:
    async def test_a_stream_that_begins_with_data_is_data_and_replays_whole(self, fetch):
        first, whole = await fetch(sse_app([CHUNK, USAGE_CHUNK, DONE]))
        assert first.kind == "data"
        assert whole == CHUNK + USAGE_CHUNK + DONE

    async def test_keep_alive_comments_before_the_first_event_are_skipped(self, fetch):
        first, whole = await fetch(sse_app([b": ping\n\n", CHUNK, DONE]))
        assert first.kind == "data"
        assert whole == b": ping\n\n" + CHUNK + DONE

    async def test_an_event_split_over_many_writes_is_read_to_its_end(self, fetch):
        pieces = [CHUNK[i : i + 7] for i in range(0, len(CHUNK), 7)] + [DONE]
        first, whole = await fetch(sse_app(pieces))
        assert first.kind == "data" and whole == CHUNK + DONE

    async def test_a_stream_with_no_body_is_empty(self, fetch):
        first, whole = await fetch(sse_app([]))
        assert first.kind == "empty" and whole == b""
        assert "empty" in first.message

    async def test_a_stream_whose_first_event_is_an_error_is_an_error_with_its_message(self, fetch):
        error = {"error": {"message": "This model's maximum context length is 2048 tokens", "type": "x"}}
        first, _ = await fetch(sse_app([b"data: " + json.dumps(error).encode() + b"\n\n"]))
        assert first.kind == "error"
        assert first.message == error["error"]["message"]

    async def test_a_named_error_event_is_an_error(self, fetch):
        first, _ = await fetch(sse_app([b"event: error\ndata: overloaded\n\n"]))
        assert (first.kind, first.message) == ("error", "overloaded")

    async def test_an_error_with_no_event_terminator_is_still_an_error(self, fetch):
        first, _ = await fetch(sse_app([b'data: {"error": "boom"}']))
        assert (first.kind, first.message) == ("error", "boom")

    async def test_a_gzipped_stream_is_read_through_its_encoding_and_replayed_as_received(self, fetch):
        raw = gzip.compress(CHUNK + DONE)
        first, whole = await fetch(sse_app([raw], {"Content-Encoding": "gzip"}))
        assert first.kind == "data" and whole == raw

    async def test_a_json_body_is_data(self, fetch):
        first, whole = await fetch(body_app(b'{"choices": []}'))
        assert first.kind == "data" and whole == b'{"choices": []}'

    async def test_an_error_key_written_with_an_escape_is_still_an_error(self, fetch):
        first, _ = await fetch(sse_app([b'data: {"\\u0065rror": {"message": "boom"}}\n\n']))
        assert (first.kind, first.message) == ("error", "boom")

    async def test_an_empty_json_body_is_empty(self, fetch):
        first, _ = await fetch(body_app(b""))
        assert first.kind == "empty"


class TestUsageTap:
    def test_keeps_the_usage_chunk_and_records_it_when_the_client_asked(self):
        tap = UsageTap(strip=False)
        assert tap.feed(CHUNK + USAGE_CHUNK + DONE) == CHUNK + USAGE_CHUNK + DONE
        assert tap.usage is not None and tap.usage.prompt_tokens == 42

    def test_strips_the_usage_chunk_the_guard_asked_for(self):
        tap = UsageTap(strip=True)
        assert tap.feed(CHUNK + USAGE_CHUNK + DONE) == CHUNK + DONE
        assert tap.usage is not None and tap.usage.prompt_tokens == 42

    def test_events_split_anywhere_come_out_whole_and_in_order(self):
        stream = CHUNK + USAGE_CHUNK + DONE
        tap = UsageTap(strip=True)
        out = b"".join(tap.feed(stream[i : i + 5]) for i in range(0, len(stream), 5)) + tap.finish()
        assert out == CHUNK + DONE and tap.usage is not None

    def test_a_chunk_with_choices_and_usage_is_kept_even_when_stripping(self):
        both = b'data: {"choices":[{"index":0,"delta":{}}],"usage":{"prompt_tokens":7}}\n\n'
        tap = UsageTap(strip=True)
        assert tap.feed(both) == both and tap.usage is not None

    def test_crlf_terminated_events_are_understood(self):
        tap = UsageTap(strip=True)
        assert tap.feed(USAGE_CHUNK.replace(b"\n", b"\r\n") + b"data: [DONE]\r\n\r\n") == b"data: [DONE]\r\n\r\n"

    def test_a_usage_key_written_with_an_escape_is_still_read_and_stripped(self):
        escaped = USAGE_CHUNK.replace(b'"usage"', b'"\\u0075sage"')
        tap = UsageTap(strip=True)
        assert tap.feed(CHUNK + escaped + DONE) == CHUNK + DONE
        assert tap.usage is not None and tap.usage.prompt_tokens == 42

    def test_a_chunk_of_whole_events_all_kept_is_forwarded_as_it_came_without_a_copy(self):
        chunk = CHUNK + CHUNK
        assert UsageTap(strip=True).feed(chunk) is chunk

    def test_a_chunk_that_ends_inside_an_event_holds_that_event_back(self):
        tap = UsageTap(strip=False)
        assert tap.feed(CHUNK + DONE[:6]) == CHUNK
        assert tap.feed(DONE[6:]) == DONE

    def test_a_compressed_stream_passes_through_untouched(self):
        raw = gzip.compress(CHUNK + USAGE_CHUNK)
        tap = UsageTap(strip=True, content_encoding="gzip")
        assert tap.feed(raw) == raw and tap.usage is None

    async def test_tapped_filters_an_async_stream(self):
        async def chunks() -> AsyncIterator[bytes]:
            for piece in (CHUNK, USAGE_CHUNK[:20], USAGE_CHUNK[20:], DONE):
                yield piece

        tap = UsageTap(strip=True)
        assert b"".join([c async for c in tapped(chunks(), tap)]) == CHUNK + DONE


# Events of every kind the tap tells apart: deltas (one naming `usage` in its text, one escaped),
# the usage chunk (its key escaped too), `[DONE]`, a comment, and some with CRLF terminators.
EVENTS = [
    CHUNK,
    b'data: {"choices":[{"delta":{"content":"the usage of words"}}]}\n\n',
    b'data: {"choices":[{"delta":{"content":"caf\\u00e9"}}]}\n\n',
    USAGE_CHUNK,
    USAGE_CHUNK.replace(b'"usage"', b'"\\u0075sage"'),
    USAGE_CHUNK.replace(b"\n", b"\r\n"),
    b": keep-alive\n\n",
    CHUNK.replace(b"\n\n", b"\r\n\r\n"),
    DONE,
]


def tapped_whole(stream: bytes, cuts: list[int], strip: bool) -> tuple[bytes, Any, bool]:
    """What the tap forwards of `stream` cut at `cuts`, the usage it read and whether it saw the end."""
    tap = UsageTap(strip=strip)
    edges = [0, *sorted(set(cuts)), len(stream)]
    out = b"".join(tap.feed(stream[a:b]) for a, b in itertools.pairwise(edges) if b > a) + tap.finish()
    return out, tap.usage, tap.ended


class TestUsageTapWhereverTheStreamIsCut:
    @settings(max_examples=300, deadline=None)
    @given(
        events=st.lists(st.sampled_from(EVENTS), max_size=12),
        cut_at=st.lists(st.floats(0, 1), max_size=8),
        between=st.lists(st.integers(0, 12), max_size=6),
        strip=st.booleans(),
    )
    def test_any_cuts_give_what_one_byte_at_a_time_gives(self, events, cut_at, between, strip):
        """One byte at a time, the tap looks at every event; in chunks it may pass whole ones on
        unread: the same bytes must come out, with the same usage and the same end. Cuts fall
        anywhere, and between events (where a server's writes usually end)."""
        stream = b"".join(events)
        ends = [sum(len(e) for e in events[:i]) for i in range(len(events) + 1)]
        cuts = [int(f * len(stream)) for f in cut_at] + [ends[i] for i in between if i < len(ends)]
        assert tapped_whole(stream, cuts, strip) == tapped_whole(stream, list(range(len(stream))), strip)


class TestAskForUsage:
    def test_adds_include_usage_to_a_stream_that_did_not_ask(self):
        body, added = ask_for_usage({"stream": True, "stream_options": {"other": 1}})
        assert added and body["stream_options"] == {"other": 1, "include_usage": True}

    def test_leaves_a_client_choice_alone(self):
        body, added = ask_for_usage({"stream": True, "stream_options": {"include_usage": False}})
        assert not added and body["stream_options"] == {"include_usage": False}

    @pytest.mark.parametrize("body", [{}, {"stream": False}, {"stream": True, "stream_options": "bad"}])
    def test_leaves_other_requests_alone(self, body):
        assert ask_for_usage(body) == (body, False)


class TestOverflowProbe:
    def test_asks_for_the_same_prompt_unstreamed_and_one_token(self):
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                "stream_options": {"include_usage": True}, "max_completion_tokens": 900, "seed": 7}
        assert overflow_probe(body) == {"model": "m", "messages": body["messages"], "seed": 7, "max_tokens": 1}


class TestUsageFromBody:
    def test_reads_a_completion_usage(self):
        usage = usage_from_body(b'{"usage": {"prompt_tokens": 12, "completion_tokens": 3}}')
        assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (12, 3)

    def test_reads_through_gzip(self):
        usage = usage_from_body(gzip.compress(b'{"usage": {"prompt_tokens": 12}}'), "gzip")
        assert usage is not None and usage.prompt_tokens == 12

    def test_a_count_beyond_64_bits_is_read_exactly(self):
        usage = usage_from_body(b'{"usage": {"prompt_tokens": 18446744073709551617}}')
        assert usage is not None and usage.prompt_tokens == 2**64 + 1

    def test_a_body_with_nan_elsewhere_still_gives_its_usage(self):
        usage = usage_from_body(b'{"logprob": NaN, "usage": {"prompt_tokens": 12}}')
        assert usage is not None and usage.prompt_tokens == 12

    @pytest.mark.parametrize("body", [b"", b"not json", b'{"usage": null}', b'{"usage": {"prompt_tokens": true}}'])
    def test_is_none_without_a_prompt_count(self, body):
        assert usage_from_body(body) is None


class KeepAliveThenClose:
    """A raw HTTP/1.1 server: on each connection it answers the first request with keep-alive,
    then closes the connection when a second request arrives on it, unanswered, like a server
    whose idle timeout closed a pooled connection just as the client reused it. With
    `every_connection_fails`, it closes every connection before answering."""

    def __init__(self, every_connection_fails: bool = False) -> None:
        self.every_connection_fails = every_connection_fails
        self.connections = 0
        self.requests = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")),
                    0,
                )
                await reader.readexactly(length)
                self.requests += 1
                if served or self.every_connection_fails:
                    return
                served += 1
                body = b'{"ok": true}'
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n"
                    b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            writer.close()


@pytest.fixture
async def raw_server() -> AsyncIterator[Callable[[KeepAliveThenClose], Any]]:
    servers: list[asyncio.base_events.Server] = []

    async def start(behaviour: KeepAliveThenClose) -> str:
        server = await asyncio.start_server(behaviour.handle, "127.0.0.1", 0)
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1/chat/completions"

    yield start
    for server in servers:
        server.close()
        await server.wait_closed()


class TestStaleRetry:
    async def test_a_request_on_a_connection_the_server_closed_is_sent_again_on_a_fresh_one(self, raw_server):
        behaviour = KeepAliveThenClose()
        url = await raw_server(behaviour)
        async with aiohttp.ClientSession() as session:
            first = await send_retrying_stale(session, "POST", url, data=b"{}")
            try:
                assert first.response.status == 200 and not first.retried
                await first.response.read()
            finally:
                await first.close()
            second = await send_retrying_stale(session, "POST", url, data=b"{}")
            try:
                assert second.response.status == 200 and second.retried
                assert await second.response.json() == {"ok": True}
            finally:
                await second.close()
        assert (behaviour.connections, behaviour.requests) == (2, 3)

    async def test_it_retries_once_only(self, raw_server):
        behaviour = KeepAliveThenClose(every_connection_fails=True)
        url = await raw_server(behaviour)
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ServerDisconnectedError):
                await send_retrying_stale(session, "POST", url, data=b"{}")
        assert behaviour.requests == 2

    async def test_a_refused_connection_is_not_retried(self):
        port = free_port()  # nothing listens on it
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.ClientConnectorError):
                await send_retrying_stale(session, "POST", f"http://127.0.0.1:{port}/", data=b"{}")


class TestStaleConnectionThroughTheProxy:
    async def test_a_chat_request_on_a_closed_pooled_connection_is_answered_not_502(self, raw_server, start_proxy):
        behaviour = KeepAliveThenClose()
        url = await raw_server(behaviour)
        proxy = await start_proxy(gateway_settings(url.removesuffix("/chat/completions")))
        body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Say hi."}]}
        async with aiohttp.ClientSession() as client:
            for _ in range(2):
                async with client.post(proxy.make_url("/v1/chat/completions"), json=body) as response:
                    assert response.status == 200
                    assert await response.json() == {"ok": True}
        assert behaviour.requests >= 3  # the second request was sent twice: once on the closed connection


class TestIsStaleConnection:
    def test_tells_a_closed_pooled_connection_from_other_failures(self):
        assert is_stale_connection(aiohttp.ServerDisconnectedError())
        assert is_stale_connection(aiohttp.ClientOSError(104, "Connection reset by peer"))
        assert not is_stale_connection(aiohttp.ClientOSError(110, "timed out"))
        assert not is_stale_connection(aiohttp.ClientPayloadError("broken body"))
