"""The suite's fake upstream checks what the guard forwards with a count of its own: OpenAI's
cookbook rule with tiktoken directly, pinned here to the counts OpenAI's API reported, so that a
guard counting wrong is refused by the fake instead of agreed with."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from tests.server.conftest import gateway_settings, long_conversation
from tests.support.cookbook import (
    COOKBOOK_MESSAGES,
    COOKBOOK_TOOL_MESSAGES,
    COOKBOOK_TOOLS,
    TOOLS_JSON_MARGIN,
    cookbook_count,
)
from tests.support.upstream import FakeUpstream

GPT4_BUDGET = 8192 - 1228 - 410  # gpt-4's window less the default output reserve and safety margin


async def chat(proxy: Any, body: dict[str, Any]) -> int:
    async with aiohttp.ClientSession() as session:
        async with session.post(proxy.make_url("/v1/chat/completions"), data=json.dumps(body)) as r:
            await r.read()
            return r.status


class TestTheCookbookCount:
    @pytest.mark.parametrize(("model", "expected"), [("gpt-3.5-turbo", 129), ("gpt-4", 129), ("gpt-4o", 124)])
    def test_messages_count_as_openais_api_reported(self, model, expected):
        assert cookbook_count({"model": model, "messages": COOKBOOK_MESSAGES}) == expected

    @pytest.mark.parametrize(("model", "expected"), [("gpt-4", 105), ("gpt-4o", 101)])
    def test_tools_counted_as_their_json_are_above_the_api_count_by_at_most_the_stated_margin(self, model, expected):
        body = {"model": model, "messages": COOKBOOK_TOOL_MESSAGES, "tools": COOKBOOK_TOOLS}
        assert expected <= cookbook_count(body) <= expected + TOOLS_JSON_MARGIN

    def test_a_file_sent_by_id_counts_nothing_and_an_image_is_refused(self):
        """The fake cannot see a file the provider reads, and counts no image rather than guess."""
        text = {"type": "text", "text": "Summarise the report."}
        file = {"type": "file", "file": {"file_id": "file-abc123"}}
        with_file = {"model": "gpt-4o", "messages": [{"role": "user", "content": [text, file]}]}
        plain = {"model": "gpt-4o", "messages": [{"role": "user", "content": text["text"]}]}
        assert cookbook_count(with_file) == cookbook_count(plain)
        image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
        with pytest.raises(NotImplementedError):
            cookbook_count({"model": "gpt-4o", "messages": [{"role": "user", "content": [image]}]})


class TestAGuardCountingWrongIsCaught:
    """The fake's window is the guard's budget for gpt-4 and it counts as OpenAI does; the guard
    trims a long conversation to its budget, then forwards it."""

    @pytest.fixture
    async def strict(self, upstream: FakeUpstream) -> FakeUpstream:
        upstream.limit, upstream.provider_factor = GPT4_BUDGET, 1.0
        return upstream

    async def test_a_guard_counting_as_openai_does_forwards_a_body_that_fits(self, start_proxy, strict):
        proxy = await start_proxy(gateway_settings(strict.url, self_correction={"enabled": False}))
        assert await chat(proxy, {"model": "gpt-4", "messages": long_conversation()}) == 200
        (received,) = strict.received
        assert cookbook_count(received.json()) <= GPT4_BUDGET

    async def test_a_guard_counting_about_half_forwards_a_body_the_fake_refuses(self, start_proxy, strict):
        """The guard's count broken on purpose (an estimate of ten characters a token, about half the truth): the fake's own count
        sees the forwarded body is too long, where a fake counting with the guard's counter would not."""
        coarse = {"overrides": [{"match": "gpt-4", "tokenizer": "estimate:10.0"}]}
        proxy = await start_proxy(gateway_settings(strict.url, models=coarse, self_correction={"enabled": False}))
        assert await chat(proxy, {"model": "gpt-4", "messages": long_conversation()}) == 400
        (received,) = strict.received
        assert cookbook_count(received.json()) > GPT4_BUDGET
