"""One call upstream (`proxy.server.upstream.forwarding.UpstreamCall`) and the headers of the guard's own
calls (`Gateway.service_headers`).

The proxy runs in-process in front of a real aiohttp upstream on 127.0.0.1; what is asserted is
what a client and an operator see: the status, the error code, the metrics and the log line.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from typing import Any

import pytest
from aiohttp import web

from proxy.server.backends.models import Models
from proxy.server.process.app import build_gateway, create_app
from tests.server.conftest import gateway_settings
from tests.server.raw_http import raw_request

STREAM = json.dumps({"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
CHAT = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).encode()
JSON = {"Content-Type": "application/json"}


def silent_stream_app(silence: float) -> web.Application:
    """Answers every chat request with the head of an event stream, then says nothing for `silence`
    seconds before one event."""

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await asyncio.sleep(silence)
        await response.write(b'data: {"choices": []}\n\ndata: [DONE]\n\n')
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


def upstream_errors(metrics: str, kind: str) -> float:
    """The value of `context_guard_upstream_errors_total` for upstream `fake` and `kind` (0 if absent)."""
    for line in metrics.splitlines():
        if line.startswith("context_guard_upstream_errors_total{") and f'kind="{kind}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class TestUpstreamCall:
    @pytest.fixture
    async def silent_proxy(self, aiohttp_server: Any, model_map: Any, logs: Any) -> Any:
        upstream = await aiohttp_server(silent_stream_app(silence=2.0))
        settings = gateway_settings(str(upstream.make_url("/v1")))
        fake = dataclasses.replace(settings.upstreams["fake"], read_timeout=0.3)
        server = dataclasses.replace(settings.server, upstream_connections=1)
        settings = dataclasses.replace(settings, upstreams={"fake": fake}, server=server)
        return await aiohttp_server(create_app(settings, Models(settings, model_map)))

    async def test_a_stream_silent_past_the_read_timeout_before_its_first_event_is_a_504(self, silent_proxy):
        response = await raw_request(silent_proxy.port, "POST", "/v1/chat/completions", STREAM, JSON)
        assert response.status == 504 and response.json()["error"]["code"] == "upstream_timeout"

    async def test_that_timeout_is_counted_once_for_its_upstream(self, silent_proxy):
        await raw_request(silent_proxy.port, "POST", "/v1/chat/completions", STREAM, JSON)
        metrics = await raw_request(silent_proxy.port, "GET", "/metrics", b"", {})
        assert upstream_errors(metrics.body.decode(), "UpstreamTimeout") == 1.0

    async def test_the_pool_slot_of_a_failed_call_is_given_back(self, silent_proxy):
        for _ in range(3):  # a pool of one slot: a slot kept by a failure would make the next a 503
            response = await raw_request(silent_proxy.port, "POST", "/v1/chat/completions", STREAM, JSON)
            assert response.status == 504

    async def test_the_log_line_says_the_upstream_time_of_the_failed_call(self, silent_proxy, logs):
        await raw_request(silent_proxy.port, "POST", "/v1/chat/completions", STREAM, JSON)
        event = next(e for e in logs.events("request") if e["path"] == "/v1/chat/completions")
        assert event["status"] == 504 and event["upstream_ms"] >= 250

    async def test_an_unreachable_upstream_is_a_502_counted_as_unavailable(self, start_proxy):
        proxy = await start_proxy(gateway_settings("http://127.0.0.1:9/v1"))
        response = await raw_request(proxy.port, "POST", "/v1/chat/completions", CHAT, JSON)
        metrics = await raw_request(proxy.port, "GET", "/metrics", b"", {})
        assert response.status == 502 and re.search(r"unreachable", response.json()["error"]["message"])
        assert upstream_errors(metrics.body.decode(), "UpstreamUnavailable") == 1.0


def status_app(status: int, body: bytes = b"") -> web.Application:
    """Answers every request with `status`, `body` and a header of its own."""

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=status, body=body or None, headers={"x-answer": "yes"})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", answer)
    return app


class TestRelayedAnswers:
    """The status line and headers travel with the first body bytes, or with the end of a body
    that has none."""

    async def proxy_for(self, aiohttp_server: Any, start_proxy: Any, upstream_app: web.Application) -> Any:
        upstream = await aiohttp_server(upstream_app)
        return await start_proxy(gateway_settings(str(upstream.make_url("/v1"))))

    async def test_an_answer_with_no_body_keeps_its_status_and_headers(self, aiohttp_server, start_proxy):
        proxy = await self.proxy_for(aiohttp_server, start_proxy, status_app(204))
        response = await raw_request(proxy.port, "DELETE", "/v1/files/f-1")
        assert response.status == 204 and response.headers["x-answer"] == "yes" and response.body == b""

    async def test_a_head_request_gets_the_headers_and_no_body(self, aiohttp_server, start_proxy):
        proxy = await self.proxy_for(aiohttp_server, start_proxy, status_app(200, b'{"data": []}'))
        response = await raw_request(proxy.port, "HEAD", "/v1/models")
        assert response.status == 200 and response.headers["x-answer"] == "yes" and response.body == b""

    async def test_a_whole_body_arrives_with_its_length(self, aiohttp_server, start_proxy):
        proxy = await self.proxy_for(aiohttp_server, start_proxy, status_app(200, b'{"data": []}'))
        response = await raw_request(proxy.port, "GET", "/v1/models")
        assert response.body == b'{"data": []}' and response.headers["Content-Length"] == "12"


class TestServiceHeaders:
    @pytest.fixture
    def gateway(self, model_map: Any) -> Any:
        settings = gateway_settings("http://127.0.0.1:9/v1")
        fake = dataclasses.replace(settings.upstreams["fake"], headers={"x-team": "search"})
        settings = dataclasses.replace(settings, upstreams={"fake": fake})
        return build_gateway(settings, Models(settings, model_map))

    def test_they_carry_the_upstreams_configured_headers_and_the_credential(self, gateway):
        headers = gateway.service_headers(gateway.settings.upstreams["fake"], "Bearer one")
        assert dict(headers) == {"x-team": "search", "Authorization": "Bearer one"}

    def test_they_are_built_once_while_the_credential_stays_the_same(self, gateway):
        upstream = gateway.settings.upstreams["fake"]
        assert gateway.service_headers(upstream, "Bearer one") is gateway.service_headers(upstream, "Bearer one")

    def test_a_rotated_credential_builds_them_anew_with_the_new_one(self, gateway):
        upstream = gateway.settings.upstreams["fake"]
        gateway.service_headers(upstream, "Bearer one")
        assert gateway.service_headers(upstream, "Bearer two")["Authorization"] == "Bearer two"
        assert "Authorization" not in gateway.service_headers(upstream, None)

    def test_a_caller_cannot_change_them(self, gateway):
        headers = gateway.service_headers(gateway.settings.upstreams["fake"], "Bearer one")
        with pytest.raises(TypeError):
            headers["Authorization"] = "Bearer other"
