"""Gemini's cached content, counted: google-genai's `generate_content` with `cached_content`
through the guard, against a fake provider that keeps caches and counts them in the prompt as
Google does (`tests.support.gemini_upstream`, its own count). The cache is made at the provider
(as `caches.create` would), so the guard first learns its size by asking
`GET cachedContents/{id}` with the request's own credential, and then from its ledger."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from google import genai
from google.genai import types

from proxy.config.settings import settings_from_dict
from proxy.server.backends.models import Models
from proxy.server.process.app import create_app
from tests.support.gemini_upstream import FakeGemini, independent_count

FLASH = "gemini-2.5-flash"
WINDOW = 32_000
RESERVE = 200
LATEST = "And the latest question, about the cached report?"


def words(n: int, word: str) -> str:
    return " ".join([word] * n)


def conversation(turns: int, each: int) -> list[types.Content]:
    """`turns` question/answer pairs of about `each` tokens apiece, then the latest question."""
    contents = []
    for i in range(turns):
        contents.append(types.Content(role="user", parts=[types.Part(text=f"question {i} " + words(each, "lorem"))]))
        contents.append(types.Content(role="model", parts=[types.Part(text=f"answer {i} " + words(each, "ipsum"))]))
    contents.append(types.Content(role="user", parts=[types.Part(text=LATEST)]))
    return contents


@pytest.fixture
async def provider(aiohttp_server: Any) -> tuple[FakeGemini, str]:
    fake = FakeGemini(limit=WINDOW)
    server = await aiohttp_server(fake.app())
    return fake, str(server.make_url("")).rstrip("/")


@pytest.fixture
async def guard_url(aiohttp_server: Any, model_map: Any, provider: tuple[FakeGemini, str]) -> str:
    _, root = provider
    data = {
        "upstreams": {"google": {"base_url": root, "kind": "gemini", "read_timeout": 10, "connect_timeout": 2}},
        "models": {"overrides": [{"match": FLASH, "context_window": WINDOW}]},
    }
    settings = settings_from_dict(data, "test.yaml", {})
    server = await aiohttp_server(create_app(settings, Models(settings, model_map)))
    return str(server.make_url("")).rstrip("/")


def a_cache(fake: FakeGemini, tokens: int) -> str:
    """A cached content of about `tokens` tokens, made at the provider; its name."""
    report = {"contents": [{"role": "user", "parts": [{"text": words(tokens, "report")}]}]}
    return str(fake.cache(report)["name"])


class TestACachedPrompt:
    async def test_a_cache_and_a_conversation_over_the_window_go_within_it_with_the_latest_turn(
        self, provider: tuple[FakeGemini, str], guard_url: str
    ) -> None:
        """A cache of 20k tokens and a 20k-token conversation on a 32k window: the guard counts
        cache + sent, cuts the conversation's oldest turns, and the provider (counting the cache
        too) receives a prompt within the window, the latest turn as it was sent."""
        fake, _ = provider
        cache = a_cache(fake, 20_000)
        contents = conversation(20, 500)
        sent_alone = independent_count({"contents": [c.model_dump(mode="json", exclude_none=True) for c in contents]})
        assert fake.cached_tokens(cache) >= 19_000 and sent_alone >= 19_000
        client = genai.Client(api_key="client-key", http_options=types.HttpOptions(base_url=guard_url))
        config = types.GenerateContentConfig(cached_content=cache, max_output_tokens=RESERVE)
        answer = await client.aio.models.generate_content(model=FLASH, contents=contents, config=config)
        assert answer.text
        received = fake.generated[-1].json()
        assert received["cachedContent"] == cache
        assert fake.cached_tokens(cache) + independent_count(received) <= WINDOW
        assert received["contents"][-1]["parts"][0]["text"] == LATEST
        assert len(received["contents"]) < len(contents)  # the conversation was cut, the cache cannot be
        asked = [r for r in fake.received if r.method == "GET"]
        assert [r.path for r in asked] == [f"/v1beta/{cache}"]
        assert asked[0].headers.get("x-goog-api-key") == "client-key"  # the request's own credential

    async def test_the_second_request_naming_the_cache_is_counted_from_the_ledger(
        self, provider: tuple[FakeGemini, str], guard_url: str
    ) -> None:
        fake, _ = provider
        cache = a_cache(fake, 5_000)
        client = genai.Client(api_key="client-key", http_options=types.HttpOptions(base_url=guard_url))
        config = types.GenerateContentConfig(cached_content=cache, max_output_tokens=RESERVE)
        for _ in range(2):
            await client.aio.models.generate_content(model=FLASH, contents=conversation(1, 50), config=config)
        assert len([r for r in fake.received if r.method == "GET"]) == 1

    async def test_a_cache_made_through_the_guard_is_counted_from_its_create_answer_without_asking(
        self, provider: tuple[FakeGemini, str], guard_url: str
    ) -> None:
        fake, _ = provider
        client = genai.Client(api_key="client-key", http_options=types.HttpOptions(base_url=guard_url))
        made = await client.aio.caches.create(
            model=FLASH, config=types.CreateCachedContentConfig(contents=[words(5_000, "report")], ttl="600s")
        )
        assert made.name is not None and made.usage_metadata is not None  # relayed as the provider answered
        config = types.GenerateContentConfig(cached_content=made.name, max_output_tokens=RESERVE)
        answer = await client.aio.models.generate_content(model=FLASH, contents=conversation(1, 50), config=config)
        assert answer.text
        assert [r for r in fake.received if r.method == "GET"] == []  # the ledger knew it from the create answer

    async def test_the_guards_count_tokens_includes_the_cache_and_says_what_kind_of_count_it_is(
        self, provider: tuple[FakeGemini, str], guard_url: str
    ) -> None:
        fake, _ = provider
        cache = a_cache(fake, 5_000)
        inner = {"model": f"models/{FLASH}", "contents": [{"role": "user", "parts": [{"text": LATEST}]}]}
        async with aiohttp.ClientSession() as session:
            url = f"{guard_url}/v1beta/models/{FLASH}:countTokens"
            headers = {"x-goog-api-key": "client-key"}
            with_cache = {"generateContentRequest": {**inner, "cachedContent": cache}}
            async with session.post(url, json=with_cache, headers=headers) as response:
                counted, kind = (await response.json())["totalTokens"], response.headers["x-context-guard-count"]
            async with session.post(url, json={"generateContentRequest": inner}, headers=headers) as response:
                alone = (await response.json())["totalTokens"]
            missing = {"generateContentRequest": {**inner, "cachedContent": "cachedContents/gone"}}
            async with session.post(url, json=missing, headers=headers) as response:
                unknown_kind = response.headers["x-context-guard-count"]
        assert counted == alone + fake.cached_tokens(cache)
        assert counted >= fake.cached_tokens(cache) + independent_count(inner)  # at least the provider's count
        assert kind in ("exact", "upper-bound")
        assert unknown_kind == "incomplete"
