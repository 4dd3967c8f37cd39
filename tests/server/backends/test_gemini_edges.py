"""Gemini through the guard at its edges: the request the guard was built for (11 MB of native
Vertex AI request for a 1M-token model), the provider's own count near the budget, and what the
log keeps of a client's key. In front of the recording fake of `tests.support.gemini_upstream`."""

from __future__ import annotations

import json
import random
import time
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from proxy.config.settings import settings_from_dict
from proxy.server.backends.models import Models
from proxy.server.process.app import create_app
from tests.support.gemini_upstream import FakeGemini, independent_count

FLASH = "gemini-2.5-flash"
RESERVE = 200
VERTEX_BASE = "{root}/v1/projects/my-project/locations/us-central1/endpoints/openapi"
SYLLABLES = ["ka", "ro", "mi", "ten", "sul", "ver", "dan", "o", "li", "pra", "gus", "em", "tha", "quo", "ne", "by"]


@pytest.fixture
async def fake(aiohttp_server: Any) -> tuple[FakeGemini, str]:
    provider = FakeGemini()
    server = await aiohttp_server(provider.app())
    return provider, str(server.make_url("")).rstrip("/")


def digits_at_the_edge() -> dict[str, Any]:
    """A prompt of digits: Gemma's vocabulary splits them one by one where the fake's cl100k takes
    three at a time, so the local count is over the budget and the provider's count within it."""
    return {
        "contents": [{"role": "user", "parts": [{"text": " ".join(["48213"] * 700)}]}],
        "generationConfig": {"maxOutputTokens": RESERVE},
    }


async def guard(aiohttp_server: Any, model_map: Any, upstream: dict[str, Any], window: int = 3000) -> str:
    data = {
        "upstreams": {"google": {"read_timeout": 120, "connect_timeout": 2, **upstream}},
        "models": {"overrides": [{"match": FLASH, "context_window": window}]},
    }
    settings = settings_from_dict(data, "test.yaml", {})
    server: TestServer = await aiohttp_server(create_app(settings, Models(settings, model_map)))
    return str(server.make_url("")).rstrip("/")


class TestOriginStory:
    async def test_an_11_mb_native_vertex_request_for_gemini_2_5_pro_reaches_vertex_within_its_window(
        self, fake: Any, aiohttp_server: Any, model_map: Any
    ) -> None:
        """The request the guard was built for: 2.8M tokens sent to a 1M-token model."""
        provider, root = fake
        upstream = {"base_url": VERTEX_BASE.format(root=root), "kind": "vertex", "token_command": "printf t"}
        data = {"upstreams": {"vertex": {**upstream, "read_timeout": 120}}}
        settings = settings_from_dict(data, "test.yaml", {})
        server: TestServer = await aiohttp_server(create_app(settings, Models(settings, model_map)))
        rng = random.Random(37)  # prose of made-up words: no two turns alike, nothing a cache could reuse
        vocabulary = [" ".join(rng.choices(SYLLABLES, k=rng.randint(1, 3))).replace(" ", "") for _ in range(5000)]
        contents = []
        for i in range(1400):
            role = "user" if i % 2 == 0 else "model"
            text = " ".join(rng.choices(vocabulary, k=1340))
            contents.append({"role": role, "parts": [{"text": f"turn {i}: {text}"}]})
        contents.append({"role": "user", "parts": [{"text": "Summarise the history above."}]})
        raw = json.dumps({"contents": contents, "generationConfig": {"maxOutputTokens": 8192}}).encode()
        assert len(raw) > 11_000_000
        path = "/v1/projects/my-project/locations/us-central1/publishers/google/models/gemini-2.5-pro:generateContent"
        started = time.perf_counter()
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{server.make_url('')}{path}".replace("//v1", "/v1"), data=raw) as response:
                assert response.status == 200
                headers = response.headers
        took = time.perf_counter() - started
        (sent,) = provider.generated
        forwarded, sent_tokens = sent.json(), independent_count(json.loads(raw))
        print(
            f"\norigin story: {len(raw) / 1e6:.1f} MB, {sent_tokens:,} tokens by cl100k, "
            f"{headers['x-context-guard-tokens-before']} counted by the guard, "
            f"{headers['x-context-guard-tokens-after']} forwarded ({independent_count(forwarded):,} by cl100k), {took:.1f} s"
        )
        assert sent_tokens > 2_700_000
        assert independent_count(forwarded) <= 1_048_576 - 8192
        assert forwarded["contents"][-1]["parts"][0]["text"] == "Summarise the history above."


class TestProviderCountAtTheEdge:
    async def test_a_request_the_bound_cannot_place_is_counted_by_the_provider_and_goes_untouched(
        self, fake: Any, aiohttp_server: Any, model_map: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Gemini counted locally with Gemma's vocabulary, which splits digits one by one where the
        fake's cl100k takes three at a time: a prompt the local count puts over the budget but the
        provider's own count puts within it is asked of the provider's countTokens (the whole
        request, with the configured key) and forwarded as sent."""
        provider, root = fake
        monkeypatch.setenv("GEMINI_KEY", "server-key")
        upstream = {"base_url": root, "kind": "gemini", "api_key_env": "GEMINI_KEY", "provider_count_ratio": 10}
        url = await guard(aiohttp_server, model_map, upstream)
        body = digits_at_the_edge()
        raw = json.dumps(body).encode()
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/v1beta/models/{FLASH}:countTokens", json=body) as counted:
                bound = (await counted.json())["totalTokens"]  # the guard's own count, answered locally
            async with session.post(f"{url}/v1beta/models/{FLASH}:generateContent", data=raw) as response:
                assert response.status == 200
                before, budget = (int(response.headers[f"x-context-guard-{h}"]) for h in ("tokens-before", "budget"))
        asked, sent = provider.received
        assert bound > budget >= independent_count(body) == before  # the bound says no, the provider's count yes
        assert asked.path == f"/v1beta/models/{FLASH}:countTokens" and asked.headers["x-goog-api-key"] == "server-key"
        assert asked.json() == {"generateContentRequest": {"contents": body["contents"], "model": f"models/{FLASH}"}}
        assert sent.body == raw


class TestGeminiStatesItsOwnRatio:
    async def test_with_no_ratio_configured_the_framing_s_overcount_is_asked_of_the_provider(
        self, fake: Any, aiohttp_server: Any, model_map: Any
    ) -> None:
        """Gemini counted with its Gemma vocabulary states how far over its framing can put the
        count (`GEMINI_FRAMING_RATIO`): a conversation of short turns the local count puts over the
        budget, the provider's count within it, is asked of countTokens with no operator setting."""
        provider, root = fake
        url = await guard(aiohttp_server, model_map, {"base_url": root, "kind": "gemini"})
        contents = [
            {"role": "user" if i % 2 == 0 else "model", "parts": [{"text": f"turn {i}: all good here"}]}
            for i in range(251)
        ]
        body = {"contents": contents, "generationConfig": {"maxOutputTokens": RESERVE}}
        raw = json.dumps(body).encode()
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/v1beta/models/{FLASH}:countTokens", json=body) as counted:
                bound = (await counted.json())["totalTokens"]
            async with session.post(f"{url}/v1beta/models/{FLASH}:generateContent", data=raw) as response:
                assert response.status == 200
                budget = int(response.headers["x-context-guard-budget"])
        asked, sent = provider.received
        assert bound > budget >= independent_count(body)  # over by the local count, within by the provider's
        assert asked.path == f"/v1beta/models/{FLASH}:countTokens"
        assert sent.body == raw


class TestLogs:
    async def test_a_client_s_key_in_the_query_is_never_logged(
        self, fake: Any, aiohttp_server: Any, model_map: Any, logs: Any
    ) -> None:
        _, root = fake
        url = await guard(aiohttp_server, model_map, {"base_url": root, "kind": "gemini"})
        body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/v1beta/models/{FLASH}:generateContent?key=AIza-secret", json=body) as r:
                assert r.status == 200
        (line,) = logs.events("request")
        assert line["kind"] == "generate_content" and line["path"] == f"/v1beta/models/{FLASH}:generateContent"
        assert "AIza-secret" not in logs.text


class TestExpressMode:
    async def test_vertex_s_express_mode_path_is_counted_and_its_key_sent_as_google_s_header(
        self, fake: Any, aiohttp_server: Any, model_map: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        provider, root = fake
        monkeypatch.setenv("VERTEX_KEY", "express-key")
        url = await guard(aiohttp_server, model_map, {"base_url": root, "kind": "vertex", "api_key_env": "VERTEX_KEY"})
        body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
        path = f"/v1/publishers/google/models/{FLASH}:generateContent"
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}{path}?key=client-key", json=body) as response:
                assert response.status == 200 and "x-context-guard-tokens-before" in response.headers
        (sent,) = provider.received
        assert sent.path == path and sent.query == "" and sent.headers["x-goog-api-key"] == "express-key"
        assert "Authorization" not in sent.headers

    async def test_at_the_budget_s_edge_express_mode_s_own_count_tokens_decides(
        self, fake: Any, aiohttp_server: Any, model_map: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An express-mode upstream (the host alone, an API key, no project) is asked at its own
        countTokens path, with its key, and a request its count fits goes as sent."""
        provider, root = fake
        monkeypatch.setenv("VERTEX_KEY", "express-key")
        upstream = {"base_url": root, "kind": "vertex", "api_key_env": "VERTEX_KEY", "provider_count_ratio": 10}
        url = await guard(aiohttp_server, model_map, upstream)
        body = digits_at_the_edge()
        raw = json.dumps(body).encode()
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/v1/publishers/google/models/{FLASH}:generateContent", data=raw) as response:
                assert response.status == 200
                before, budget = (int(response.headers[f"x-context-guard-{h}"]) for h in ("tokens-before", "budget"))
        asked, sent = provider.received
        assert budget >= independent_count(body) == before
        assert asked.path == f"/v1/publishers/google/models/{FLASH}:countTokens"
        assert asked.headers["x-goog-api-key"] == "express-key" and "Authorization" not in asked.headers
        assert asked.json() == {"contents": body["contents"]}
        assert sent.body == raw


class TestBrokenJsonArrayStream:
    async def test_a_json_array_stream_the_provider_breaks_is_cut_off_never_closed_as_whole(
        self, fake: Any, aiohttp_server: Any, model_map: Any
    ) -> None:
        """Without `alt=sse` Gemini streams one JSON array: a break is said by ending the
        connection before its `]`, so no client can read a truncated array as a whole one."""
        provider, root = fake
        provider.break_stream_after = 1
        url = await guard(aiohttp_server, model_map, {"base_url": root, "kind": "gemini"})
        body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/v1beta/models/{FLASH}:streamGenerateContent", json=body) as response:
                assert response.status == 200
                with pytest.raises(aiohttp.ClientPayloadError):
                    await response.read()


class TestObservability:
    async def test_the_page_and_the_metrics_show_gemini_requests_as_their_own_kind(
        self, fake: Any, aiohttp_server: Any, model_map: Any
    ) -> None:
        _, root = fake
        url = await guard(aiohttp_server, model_map, {"base_url": root, "kind": "gemini"})
        body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/v1beta/models/{FLASH}:generateContent", json=body) as response:
                assert (
                    response.headers["x-context-guard-tokens-before"]
                    == response.headers["x-context-guard-tokens-after"]
                )
            async with session.post(f"{url}/v1beta/models/{FLASH}:countTokens", json=body):
                pass
            async with session.get(f"{url}/context-guard/recent.json") as page:
                rows = (await page.json())["rows"]
            async with session.get(f"{url}/metrics") as metrics:
                text = await metrics.text()
        assert {row["kind"] for row in rows} == {"generate_content", "generate_content.count_tokens"}
        assert 'context_guard_requests_total{kind="generate_content",outcome="unchanged",status="2xx"}' in text
