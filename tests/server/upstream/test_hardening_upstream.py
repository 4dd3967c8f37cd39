"""HTTP hygiene with misbehaving upstreams and clients: hop headers, truncation, hangs, departures, a full pool."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from proxy.server.backends.models import Models
from proxy.server.process.app import create_app
from proxy.server.request.flow import request_id_of
from proxy.server.upstream.connection import UPSTREAM_POOL, PoolPolicy, UpstreamPool, UpstreamRequest, connection_named
from tests.server.conftest import gateway_settings
from tests.server.raw_http import RawUpstream, raw_request, read_response

CHAT = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).encode()
STREAM = json.dumps({"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
JSON = {"Content-Type": "application/json"}


def upstream_reply(head: str, body: bytes = b"") -> bytes:
    return head.replace("\n", "\r\n").encode() + b"\r\n" + body


async def through_raw_upstream(start_proxy, reply: bytes, body: bytes, *, hang: bool = False, read_timeout: float = 5):
    """The client's answer to `body` through a proxy whose one upstream answers `reply`."""
    async with RawUpstream(reply, hang=hang) as raw:
        settings = gateway_settings(raw.url, upstreams={"fake": {"base_url": raw.url, "read_timeout": read_timeout}})
        proxy = await start_proxy(settings)
        return await raw_request(proxy.port, "POST", "/v1/chat/completions", body, JSON, timeout=8)


class TestConnectionHeaders:
    def test_names_listed_in_connection_and_proxy_connection_are_hop_by_hop(self):
        headers = {"Connection": "keep-alive, X-Hop", "Proxy-Connection": "x-other ,", "X-Hop": "1"}
        assert connection_named(headers) == {"keep-alive", "x-hop", "x-other"}

    async def test_they_are_dropped_on_the_way_up(self, proxy, upstream):
        headers = {
            **JSON,
            "Connection": "close, X-Secret-Hop",
            "X-Secret-Hop": "1",
            "Proxy-Connection": "X-Other",
            "X-Other": "2",
            "X-Kept": "3",
        }
        assert (await raw_request(proxy.port, "POST", "/v1/chat/completions", CHAT, headers)).status == 200
        received = {name.lower() for name in upstream.received[-1].headers}
        assert "x-kept" in received and not received & {"x-secret-hop", "x-other", "proxy-connection"}

    async def test_they_are_dropped_on_the_way_down(self, start_proxy):
        reply = upstream_reply(
            "HTTP/1.1 200 OK\nContent-Type: application/json\nConnection: X-Up-Hop\nX-Up-Hop: 1\n"
            "Proxy-Connection: close\nX-Kept: 2\nContent-Length: 2\n",
            b"{}",
        )
        response = await through_raw_upstream(start_proxy, reply, CHAT)
        assert response.status == 200 and response.headers["X-Kept"] == "2"
        assert "X-Up-Hop" not in response.headers and "Proxy-Connection" not in response.headers


class TestTruncatedUpstreamBodies:
    @pytest.mark.parametrize("hang", [False, True], ids=["closes", "hangs"])
    async def test_a_short_body_aborts_the_client_connection(self, start_proxy, hang, logs):
        reply = upstream_reply("HTTP/1.1 200 OK\nContent-Type: application/json\nContent-Length: 1000\n", b"x" * 100)
        response = await through_raw_upstream(start_proxy, reply, CHAT, hang=hang, read_timeout=1)
        assert response.status == 200 and not response.complete and len(response.body) == 100
        assert "ended the stream early" in logs.events("request")[-1]["stream_broken"]

    async def test_a_short_chunked_body_is_never_completed(self, start_proxy):
        reply = upstream_reply(
            "HTTP/1.1 200 OK\nContent-Type: application/json\nTransfer-Encoding: chunked\n", b"5\r\nhello\r\n"
        )
        response = await through_raw_upstream(start_proxy, reply, CHAT)
        assert response.status == 200 and response.body == b"hello" and not response.complete

    async def test_an_event_stream_broken_after_its_first_event_ends_with_an_error_event(self, start_proxy):
        reply = upstream_reply(
            "HTTP/1.1 200 OK\nContent-Type: text/event-stream\nTransfer-Encoding: chunked\n",
            b"a\r\ndata: {}\n\n\r\n8\r\ndata: {}\r\n",
        )
        response = await through_raw_upstream(start_proxy, reply, STREAM)
        assert response.complete and response.body.startswith(b"data: {}") and b"upstream_stream_broken" in response.body

    async def test_an_event_stream_broken_before_its_first_event_is_a_proper_error(self, start_proxy):
        reply = upstream_reply(
            "HTTP/1.1 200 OK\nContent-Type: text/event-stream\nTransfer-Encoding: chunked\n", b"8\r\ndata: {}\r\n"
        )
        response = await through_raw_upstream(start_proxy, reply, STREAM)
        assert response.status == 502 and b"upstream_unavailable" in response.body


class TestMalformedAndSilentUpstreams:
    async def test_malformed_sse_is_relayed_as_it_came(self, start_proxy, logs):
        garbage = b"data: {not json\n\nevent: ???\n\x00\xff\n\ndata: [DONE]\n\n"
        reply = upstream_reply(
            f"HTTP/1.1 200 OK\nContent-Type: text/event-stream\nContent-Length: {len(garbage)}\n", garbage
        )
        response = await through_raw_upstream(start_proxy, reply, STREAM)
        assert response.status == 200 and response.body == garbage
        assert [e["status"] for e in logs.events("request")] == [200]

    async def test_an_upstream_that_never_answers_is_a_504(self, start_proxy):
        response = await through_raw_upstream(start_proxy, b"", CHAT, hang=True, read_timeout=0.5)
        assert response.status == 504 and response.json()["error"]["code"] == "upstream_timeout"


async def the_request_event(logs) -> dict:
    """The one `request` log event, once the handler has written it."""
    await asyncio.wait_for(logs.written("request"), 30)
    [event] = logs.events("request")
    return event


class TestClientsThatLeave:
    async def test_a_client_gone_while_the_upstream_thinks_is_logged_as_499(self, proxy, upstream, logs):
        upstream.hold = asyncio.Event()  # the upstream thinks until the test ends
        _, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(CHAT)}\r\n\r\n".encode() + CHAT
        )
        await writer.drain()
        try:
            await asyncio.wait_for(upstream.arrived.wait(), 30)
            writer.close()
            event = await the_request_event(logs)
        finally:
            upstream.hold.set()
        assert event["status"] == 499 and event["error"] == "client_disconnected"

    async def test_a_client_gone_mid_stream_is_logged_as_499(self, proxy, upstream, logs):
        upstream.stream_chunks, upstream.chunk_delay = 200, 0.02
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(STREAM)}\r\n\r\n".encode() + STREAM
        )
        await reader.readuntil(b"part1")
        writer.transport.abort()
        await asyncio.wait_for(upstream.stream_cancelled.wait(), 5)
        event = await the_request_event(logs)
        assert event["status"] == 499 and event["error"] == "client_disconnected"


class TestCookies:
    """The gateway keeps no cookies: each client's own go up as it sent them, and what an upstream
    sets for one client goes back to that client alone."""

    @pytest.fixture
    async def cookie_upstream(self, aiohttp_server):
        seen: list[str | None] = []

        async def chat(request: web.Request) -> web.Response:
            seen.append(request.headers.get("Cookie"))
            answer = web.json_response({"id": "c", "object": "chat.completion", "choices": []})
            if request.headers.get("X-Client") == "alice":
                answer.set_cookie("session", "alice-secret", path="/")
            return answer

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        server = await aiohttp_server(app)
        # A host name, not an IP address: aiohttp's default jar keeps cookies only for names.
        return f"http://localhost:{server.port}/v1", seen

    async def test_a_cookie_set_for_one_client_is_never_sent_for_another(self, start_proxy, cookie_upstream):
        url, seen = cookie_upstream
        proxy = await start_proxy(gateway_settings(url, upstreams={"fake": {"base_url": url}}))
        alice = await raw_request(proxy.port, "POST", "/v1/chat/completions", CHAT, {**JSON, "X-Client": "alice"})
        bob = await raw_request(proxy.port, "POST", "/v1/chat/completions", CHAT, {**JSON, "X-Client": "bob"})
        assert alice.status == bob.status == 200
        assert "session=alice-secret" in alice.headers["Set-Cookie"] and "Set-Cookie" not in bob.headers
        assert seen == [None, None]

    async def test_a_clients_own_cookie_header_goes_up_as_sent(self, start_proxy, cookie_upstream):
        url, seen = cookie_upstream
        proxy = await start_proxy(gateway_settings(url, upstreams={"fake": {"base_url": url}}))
        headers = {**JSON, "X-Client": "alice", "Cookie": "theirs=1; other=2"}
        for _ in range(2):  # the second time too: nothing the first answer set is added
            assert (await raw_request(proxy.port, "POST", "/v1/chat/completions", CHAT, headers)).status == 200
        assert seen == ["theirs=1; other=2", "theirs=1; other=2"]


class TestAcceptEncoding:
    @pytest.mark.parametrize("given", [None, "gzip", "identity"])
    async def test_the_upstream_is_asked_for_the_encodings_the_client_asked_for_and_no_other(
        self, proxy, upstream, given
    ):
        headers = JSON if given is None else {**JSON, "Accept-Encoding": given}
        assert (await raw_request(proxy.port, "POST", "/v1/chat/completions", CHAT, headers)).status == 200
        assert {k.lower(): v for k, v in upstream.received[-1].headers.items()}.get("accept-encoding") == given

    async def test_the_other_headers_aiohttp_adds_are_added_as_it_adds_them(self):
        url, given = URL("http://127.0.0.1:9/v1/chat/completions"), {"Content-Type": "application/json"}
        ours = UpstreamRequest("POST", url, headers=given, data=b"{}", loop=asyncio.get_running_loop())
        theirs = aiohttp.ClientRequest(
            "POST", url, headers=given, data=b"{}", loop=asyncio.get_running_loop(), skip_auto_headers=["Accept-Encoding"]
        )
        assert list(ours.headers.items()) == list(theirs.headers.items())
        assert "Accept" in ours.headers and "User-Agent" in ours.headers and "Accept-Encoding" not in ours.headers
        asked = UpstreamRequest(
            "POST", url, headers=given, data=b"{}", loop=asyncio.get_running_loop(), skip_auto_headers=["User-Agent"]
        )
        assert "User-Agent" not in asked.headers and "Accept-Encoding" not in asked.headers


class AskedPool(UpstreamPool):
    """The app's upstream pool, which also says each time a request asks it for a slot."""

    def __init__(self, policy: PoolPolicy) -> None:
        super().__init__(policy)
        self.asked: asyncio.Queue[None] = asyncio.Queue()

    async def acquire(self, client: str = "") -> None:
        self.asked.put_nowait(None)
        await super().acquire(client)


class TestPool:
    """One slot: the first request holds it while the upstream thinks (until the test lets it answer)."""

    @pytest.fixture
    def one_slot_proxy(self, aiohttp_server, model_map, upstream):
        async def start(wait: float) -> tuple[TestServer, AskedPool]:
            settings = gateway_settings(upstream.url)
            server = dataclasses.replace(settings.server, upstream_connections=1, connection_wait_seconds=wait)
            settings = dataclasses.replace(settings, server=server)
            app = create_app(settings, Models(settings, model_map))
            app[UPSTREAM_POOL] = pool = AskedPool(app[UPSTREAM_POOL].policy)
            return await aiohttp_server(app), pool

        return start

    async def test_a_full_pool_is_a_503_overloaded_with_retry_after(self, one_slot_proxy, upstream):
        proxy, _ = await one_slot_proxy(wait=0.3)
        upstream.hold = asyncio.Event()
        busy = asyncio.create_task(raw_request(proxy.port, "POST", "/v1/chat/completions", CHAT, JSON))
        try:
            await asyncio.wait_for(upstream.arrived.wait(), 30)
            response = await raw_request(proxy.port, "POST", "/v1/chat/completions", CHAT, JSON)
        finally:
            upstream.hold.set()
        assert response.status == 503 and response.json()["error"]["code"] == "overloaded"
        assert response.headers["Retry-After"] == "1" and len(upstream.received) == 1
        assert (await busy).status == 200

    async def test_a_request_waits_for_a_slot_freed_within_the_wait(self, one_slot_proxy, upstream):
        proxy, pool = await one_slot_proxy(wait=60)
        upstream.hold = asyncio.Event()
        busy = asyncio.create_task(raw_request(proxy.port, "POST", "/v1/chat/completions", CHAT, JSON))
        waiting = asyncio.create_task(raw_request(proxy.port, "POST", "/v1/chat/completions", CHAT, JSON))
        try:
            for _ in range(2):  # both have asked; the one the upstream has not seen waits for the slot
                await asyncio.wait_for(pool.asked.get(), 30)
            await asyncio.wait_for(upstream.arrived.wait(), 30)
            assert len(upstream.received) == 1 and not waiting.done()
        finally:
            upstream.hold.set()
        assert (await busy).status == (await waiting).status == 200 and len(upstream.received) == 2

    async def test_a_freed_slot_serves_the_next_request(self, one_slot_proxy, upstream):
        proxy, _ = await one_slot_proxy(wait=0.3)
        for _ in range(3):
            assert (await raw_request(proxy.port, "POST", "/v1/chat/completions", CHAT, JSON)).status == 200

    @pytest.mark.parametrize(("size", "wait"), [(0, 1.0), (True, 1.0), (4, -1)])
    def test_a_bad_pool_setting_is_a_value_error(self, size, wait):
        with pytest.raises(ValueError, match=r"upstream_connections|connection_wait_seconds"):
            PoolPolicy(size=size, wait=wait)


class TestRequestIds:
    @pytest.mark.parametrize(
        ("given", "kept"),
        [
            ("req-123_ABC", True),
            ("x" * 128, True),
            ("x" * 129, False),
            ("a b", False),
            ("caf\u00e9", False),
            ("", False),
        ],
    )
    def test_only_short_printable_ascii_ids_are_kept(self, given, kept):
        assert (request_id_of(given) == given) is kept

    async def test_a_smuggled_id_is_replaced_in_the_answer_and_the_log(self, proxy, upstream, logs):
        response = await raw_request(
            proxy.port, "POST", "/v1/chat/completions", CHAT, {**JSON, "x-request-id": "a" * 300}
        )
        assert response.status == 200 and len(response.headers["x-request-id"]) == 32
        assert logs.events("request")[-1]["request_id"] == response.headers["x-request-id"]
        sent = {k.lower(): v for k, v in upstream.received[-1].headers.items()}
        assert sent["x-request-id"] == response.headers["x-request-id"]  # one id everywhere

    async def test_a_kept_id_goes_upstream_as_sent(self, proxy, upstream):
        headers = {**JSON, "X-Request-ID": "req-123_ABC"}
        assert (await raw_request(proxy.port, "POST", "/v1/chat/completions", CHAT, headers)).status == 200
        assert [v for k, v in upstream.received[-1].headers.items() if k.lower() == "x-request-id"] == ["req-123_ABC"]

    async def test_a_non_utf8_id_is_replaced_and_the_request_still_logged(self, proxy, upstream, logs):
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: {len(CHAT)}\r\n"
        writer.write(head.encode() + b"x-request-id: \xff\xfe\r\n\r\n" + CHAT)
        response = await asyncio.wait_for(read_response(reader), 5)
        writer.close()
        assert response.status == 200 and len(response.headers["x-request-id"]) == 32
        assert logs.events("request")[-1]["request_id"] == response.headers["x-request-id"]


class TestDistinctTimeouts:
    async def test_a_slow_upstream_is_a_504_not_an_overload(self, upstream, aiohttp_server, model_map):
        upstream.delay = 3
        settings = gateway_settings(upstream.url, upstreams={"fake": {"base_url": upstream.url, "read_timeout": 0.3}})
        slow = await aiohttp_server(create_app(settings, Models(settings, model_map)))
        async with (
            aiohttp.ClientSession() as session,
            session.post(slow.make_url("/v1/chat/completions"), data=CHAT) as r,
        ):
            assert r.status == 504 and (await r.json())["error"]["code"] == "upstream_timeout"
