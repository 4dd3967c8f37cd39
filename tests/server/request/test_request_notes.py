"""A request's notes: the one channel by which what each step had to say reaches the operator,
on the request's log line and its row on the page."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.server.conftest import gateway_settings


async def chat(proxy: Any) -> aiohttp.ClientResponse:
    body = {"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hello there"}]}
    async with aiohttp.ClientSession() as session:
        async with session.post(proxy.make_url("/v1/chat/completions"), json=body) as response:
            await response.read()
            return response


class TestWhyTheBackendDidNotCount:
    async def test_a_backend_tokenizer_asked_of_an_upstream_without_one_is_said_on_the_line(
        self, start_proxy, upstream, logs
    ):
        """`tokenize: backend` where the upstream offers no tokenize endpoint: the request is
        counted with the model's tokenizer, and its line says why the backend did not count it."""
        fake = {"base_url": upstream.url, "kind": "generic", "read_timeout": 5, "tokenize": "backend"}
        proxy = await start_proxy(gateway_settings(upstream.url, upstreams={"fake": fake}))
        assert (await chat(proxy)).status == 200
        [event] = logs.events("request")
        assert "backend_count_skipped: no tokenize endpoint" in event["notes"]

    async def test_a_request_counted_as_configured_carries_no_such_note(self, proxy, logs):
        assert (await chat(proxy)).status == 200
        [event] = logs.events("request")
        assert not any(note.startswith("backend_count") for note in event.get("notes", []))
