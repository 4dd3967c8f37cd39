"""Every client-supplied name is bounded and escaped.

A model name keys a profile, a route, learned state, a metrics label, the log line and a row of
the recent-decisions page: one longer than 256 characters is refused in the API's own shape before
anything keys on it, and a name with control characters cannot forge a console log line.
"""

# ruff: noqa: F811  # fixtures imported from tests/server/conftest.py, named again as parameters

from __future__ import annotations

import io
from typing import Any

import aiohttp
import pytest

from proxy.logging import configure_logging
from tests.server.conftest import logs, proxy, start_proxy, upstream  # noqa: F401  # fixtures

LONG = "gpt-4o-" + "x" * 1_000_000  # a megabyte of model name
HI = [{"role": "user", "content": "hi"}]


async def post(proxy: Any, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.post(proxy.make_url(path), json=body) as r:
            return r.status, await r.json()


class TestALongName:
    @pytest.mark.parametrize(
        ("path", "body"),
        [
            ("/v1/chat/completions", {"model": LONG, "messages": HI}),
            ("/v1/responses", {"model": LONG, "input": "hi"}),
            ("/v1/completions", {"model": LONG, "prompt": "hi"}),
            ("/v1/embeddings", {"model": LONG, "input": "hi"}),  # passed through, but routed by its model
            (f"/openai/deployments/{'d' * 300}/chat/completions", {"messages": HI}),
        ],
    )
    async def test_is_refused_in_openai_shape_and_never_logged_or_kept(self, proxy, upstream, logs, path, body):
        for _ in range(3):
            status, answer = await post(proxy, path, body)
            assert status == 400 and answer["error"]["type"] == "invalid_request_error"
            assert "at most 256 characters" in answer["error"]["message"]
        assert upstream.received == []
        assert all(len(line.encode()) <= 4095 for line in logs.text.splitlines())
        async with aiohttp.ClientSession() as session, session.get(proxy.make_url("/context-guard/recent.json")) as r:
            page = await r.read()
        assert len(page) < 16_384

    async def test_is_refused_in_anthropic_shape_on_messages(self, proxy, upstream):
        status, answer = await post(proxy, "/v1/messages", {"model": LONG, "max_tokens": 10, "messages": HI})
        assert status == 400 and answer["type"] == "error"
        assert answer["error"]["type"] == "invalid_request_error" and "256" in answer["error"]["message"]
        assert upstream.received == []

    async def test_of_256_characters_is_served(self, proxy, upstream):
        status, _ = await post(proxy, "/v1/chat/completions", {"model": "m" * 256, "messages": HI})
        assert status == 200 and len(upstream.received) == 1


class TestTheConsoleLog:
    async def test_writes_control_characters_in_a_name_as_escapes(self, proxy, upstream):
        console = io.StringIO()
        configure_logging("console", "info", stream=console)
        forged = "gpt-4o\n2026-11-25T00:00:00Z info request  request_id=admin-audit outcome=ok\x1b[2K\r"
        status, _ = await post(proxy, "/v1/chat/completions", {"model": forged, "messages": HI})
        assert status == 200
        lines = console.getvalue().splitlines()
        assert len(lines) == 1 and "\x1b" not in lines[0] and "\r" not in lines[0]
        assert "model=gpt-4o\\x0a2026-11-25T00:00:00Z info request  request_id=admin-audit" in lines[0]
