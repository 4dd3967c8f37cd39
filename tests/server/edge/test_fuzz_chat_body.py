"""Arbitrary JSON values in every field of a chat body never get a 5xx, and the proxy stays healthy.

The proxy and a fake upstream run on real sockets in a background event loop for the whole module;
each example is one HTTP request from a plain blocking client.
"""

from __future__ import annotations

import asyncio
import http.client
import io
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings

from proxy.logging import configure_logging
from proxy.server.backends.models import Models
from proxy.server.process.app import create_app
from tests.server.conftest import gateway_settings
from tests.support.fuzz_bodies import fuzzed_bodies
from tests.support.upstream import FakeUpstream


@dataclass
class Running:
    port: int
    upstream: FakeUpstream
    log: io.StringIO

    def post(self, body: bytes, path: str = "/v1/chat/completions") -> tuple[int, Any]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request("POST", path, body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            data = response.read()
        finally:
            connection.close()
        try:
            return response.status, json.loads(data)
        except ValueError:
            return response.status, data

    def get(self, path: str) -> int:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.request("GET", path)
            return connection.getresponse().status
        finally:
            connection.close()


@pytest.fixture(scope="module")
def running(model_map: Any) -> Iterator[Running]:
    log = io.StringIO()
    configure_logging("json", "info", stream=log)
    loop = asyncio.new_event_loop()
    runners: list[web.AppRunner] = []

    async def start(app: web.Application) -> int:
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        return int(runner.addresses[0][1])

    upstream = FakeUpstream()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    upstream_port = asyncio.run_coroutine_threadsafe(start(upstream.app()), loop).result(30)
    proxy_settings = gateway_settings(
        f"http://127.0.0.1:{upstream_port}/v1",
        models={"overrides": [{"match": "tiny-model", "context_window": 600, "tokenizer": "tiktoken:o200k_base"}]},
    )
    proxy_port = asyncio.run_coroutine_threadsafe(
        start(create_app(proxy_settings, Models(proxy_settings, model_map))), loop
    ).result(30)
    try:
        yield Running(proxy_port, upstream, log)
    finally:

        async def stop() -> None:
            for runner in reversed(runners):
                await runner.cleanup()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


class TestFuzzedChatBodies:
    @settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(body=fuzzed_bodies())
    def test_no_body_gets_a_5xx(self, running: Running, body: bytes):
        status, answer = running.post(body)
        assert status < 500, (status, answer)
        if status >= 400:
            assert set(answer["error"]) == {"message", "type", "param", "code"}

    def test_the_proxy_is_healthy_afterwards_and_logged_no_internal_error(self, running: Running):
        assert running.get("/healthz") == 200
        assert "unhandled_error" not in running.log.getvalue()
        status, _ = running.post(
            json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).encode()
        )
        assert status == 200
