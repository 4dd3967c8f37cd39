"""Attacks on the pass-through to a Google upstream (`kind: gemini`, the operator's key), over real
sockets, each beside its control: the whole Gemini API used to be reachable on the operator's key,
uncounted (`/v1/v1beta/...` became a real Gemini URL; `:batchGenerateContent`, `tunedModels`, odd
spellings of `:generateContent` went through; `/v1/interactions` reached a host-root upstream as
`/interactions`, and other `/v1/...` paths lost their `/v1`). Now pass-through to Google is an
allow-list, every generating method no adapter counts is refused, and refusals come in Google's
shape (google-genai prints them)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from proxy.config.settings import settings_from_dict
from tests.adversarial.conftest import CLIENT_TIMEOUT
from tests.support.gemini_upstream import FakeGemini

FLASH = "gemini-2.5-flash"
CONTENTS = {"contents": [{"role": "user", "parts": [{"text": "hello " * 50}]}]}


async def call(url: str, method: str = "POST", body: Any = None) -> tuple[int, Any]:
    async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session:
        async with session.request(method, url, json=body, headers={"x-goog-api-key": "client-key"}) as response:
            text = await response.text()
            return response.status, json.loads(text) if text else None


@pytest.fixture
async def gemini(serve_guard: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, FakeGemini]:
    monkeypatch.setenv("GEMINI_KEY", "operator-key")
    provider = FakeGemini()

    def settings(url: str) -> Any:
        upstream = {"base_url": url.removesuffix("/v1"), "kind": "gemini", "api_key_env": "GEMINI_KEY"}
        return settings_from_dict({"upstreams": {"gemini": upstream}}, "adversarial.yaml", {})

    return await serve_guard(settings, upstream=provider.app()), provider


def google_refusal(status: int, body: Any) -> bool:
    error = body["error"]
    return status == 404 and error["code"] == 404 and error["status"] == "NOT_FOUND" and error["message"]


class TestGeneratingMethods:
    @pytest.mark.parametrize(
        "path",
        [
            f"/v1beta/models/{FLASH}:batchGenerateContent",
            f"/v1beta/models/{FLASH}:predictLongRunning",
            f"/v1beta/models/{FLASH}:predict",
            f"/v1beta/models/{FLASH}:GenerateContent",
            f"/v1beta/models/{FLASH}:generatecontent",
            f"/v1beta/models/{FLASH}%3AGenerateContent",
            f"/v1/v1beta/models/{FLASH}:generateContent",
            "/v1beta/tunedModels/mine:generateContent",
            f"/upload/v1beta/models/{FLASH}:generateContent",
        ],
    )
    async def test_an_uncounted_way_to_generate_is_refused_and_reaches_nothing(self, gemini, path):
        guard, provider = gemini
        status, body = await call(guard.url(path), body={"requests": [CONTENTS] * 20, **CONTENTS})
        assert google_refusal(status, body)
        assert provider.received == []

    async def test_control_generate_content_on_its_own_path_is_counted_and_forwarded(self, gemini):
        guard, provider = gemini
        status, _ = await call(guard.url(f"/v1beta/models/{FLASH}:generateContent"), body=CONTENTS)
        assert status == 200 and provider.received[-1].path == f"/v1beta/models/{FLASH}:generateContent"
        assert provider.received[-1].headers["x-goog-api-key"] == "operator-key"


class TestTheAllowList:
    @pytest.mark.parametrize(
        ("method", "path"),
        [
            ("GET", "/v1beta/tunedModels"),
            ("POST", "/v1beta/tunedModels"),
            ("POST", "/v1beta/batches"),
            ("POST", "/v1beta/corpora"),
            ("POST", f"/v1beta/models/{FLASH}"),
            ("GET", "/v1beta/operations/abc"),
            ("POST", "/v1/projects/p/locations/l/endpoints/openapi/chat/completions"),
        ],
    )
    async def test_a_path_off_the_list_is_refused_in_google_s_shape(self, gemini, method, path):
        guard, provider = gemini
        status, body = await call(guard.url(path), method, body={"model": f"models/{FLASH}"})
        assert status == 404 and body["error"]["status"] == "NOT_FOUND"
        assert provider.received == []

    @pytest.mark.parametrize(
        ("method", "path"),
        [
            ("GET", "/v1beta/cachedContents"),
            ("GET", "/v1/cachedContents"),
            ("GET", "/v1beta/models"),
            ("GET", f"/v1/models/{FLASH}"),
            ("GET", "/v1beta/files"),
        ],
    )
    async def test_control_caches_files_and_listings_pass_under_their_own_version(self, gemini, method, path):
        guard, provider = gemini
        status, _ = await call(guard.url(path), method)
        assert status == 200 and provider.received[-1].path == path
        assert provider.received[-1].headers["x-goog-api-key"] == "operator-key"


class TestTheSideDoor:
    async def test_interactions_under_v1_are_counted_not_passed(self, gemini):
        """`/v1/interactions` is the Interactions API: counted, and over the window refused before it is sent."""
        guard, provider = gemini
        body = {"model": FLASH, "input": "hi", "system_instruction": "lorem " * 1_100_000}
        status, answer = await call(guard.url("/v1/interactions"), body=body)
        assert status == 400 and answer["error"]["code"] == "invalid_request"
        assert provider.received == []

    async def test_control_an_interaction_that_fits_reaches_the_host_root_under_v1(self, gemini):
        guard, provider = gemini
        status, _ = await call(guard.url("/v1/interactions"), body={"model": FLASH, "input": "hi"})
        assert status == 200 and provider.received[-1].path == "/v1/interactions"

    async def test_a_v1_path_keeps_its_v1_at_a_host_root_upstream(self, gemini):
        guard, provider = gemini
        status, _ = await call(guard.url("/v1/cachedContents"), body={"model": f"models/{FLASH}", "contents": []})
        assert status == 200 and provider.received[-1].path == "/v1/cachedContents"

    async def test_an_unknown_native_path_says_so_in_google_s_shape(self, gemini):
        """google-genai prints the message (it printed `404 None.` for OpenAI's shape)."""
        guard, _ = gemini
        status, body = await call(guard.url("/v1beta/nothingHere"), "GET")
        assert google_refusal(status, body) and "/v1beta/nothingHere" in body["error"]["message"]
