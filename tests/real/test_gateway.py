"""The whole guard, in process, in front of a real llama.cpp server, as a new user would run it.

Each test builds its own proxy (a fresh guard: nothing learned) in front of the session's server.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from proxy.guard import Guard
from proxy.server.app import create_app
from proxy.settings import settings_from_dict
from tests.real.corpus import KINDS, body, over_window
from tests.real.llama import MODEL, LlamaServer

pytestmark = pytest.mark.real


async def start_guard(aiohttp_server: Any, llama: LlamaServer, **upstream: Any) -> Any:
    settings = settings_from_dict(
        {"upstreams": {"llama": {"base_url": llama.url, "kind": "auto", "read_timeout": 120, **upstream}}},
        "real.yaml",
        {},
    )
    return await aiohttp_server(create_app(settings, Guard(settings)))


async def ask(session: aiohttp.ClientSession, url: str, request: dict[str, Any]) -> tuple[int, dict[str, str], str]:
    """POST `request`; the status, the headers, and the completion's text ("" when there is none)."""
    async with session.post(url, json=request) as response:
        raw = await response.read()
        headers = dict(response.headers)
        if response.status != 200:
            return response.status, headers, raw[:300].decode("utf-8", "replace")
    if request.get("stream"):
        text = []
        for line in raw.decode().splitlines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                assert "error" not in chunk, chunk
                text += [c["delta"].get("content") or "" for c in chunk.get("choices", [])]
        return 200, headers, "".join(text) if raw.strip() else ""
    answer = json.loads(raw)
    return 200, headers, answer["choices"][0]["message"]["content"] or "(empty message)"


class TestWithNoConfig:
    """Waits on the handler's wiring of streams.peek_first_event (an empty stream is an overflow:
    self-correct and retry) and of the overflow probe for llama-cpp-python."""

    async def test_every_over_window_conversation_is_answered_with_a_completion(self, aiohttp_server, llama):
        proxy = await start_guard(aiohttp_server, llama)
        failures = []
        async with aiohttp.ClientSession() as session:
            for name, request in over_window(MODEL):
                status, _, text = await ask(session, str(proxy.make_url("/v1/chat/completions")), request)
                if status != 200 or not text:
                    failures.append(f"{name}: {status} {text!r}")
        assert len(over_window(MODEL)) >= 15
        assert failures == []


class TestWithTheBackendTokenizer:
    """Waits on wiring: settings keys `upstreams.<name>.kind` and `.tokenize`, and the handler
    calling BackendCounter.prepare() before it plans."""

    @pytest.mark.parametrize("stream", [False, True])
    async def test_every_request_fits_first_time_within_two_percent_never_under(self, aiohttp_server, llama, stream):
        proxy = await start_guard(aiohttp_server, llama, kind="llamacpp", tokenize="backend")
        url = str(proxy.make_url("/v1/chat/completions"))
        async with aiohttp.ClientSession() as session:
            for kind in KINDS:
                request = body(kind, 8, MODEL, stream=False)
                async with session.post(url, json={**request, "max_tokens": 1}) as response:
                    assert response.status == 200, await response.text()
                    answer = await response.json()
                    ours = int(response.headers["x-context-guard-tokens-after"])
                theirs = answer["usage"]["prompt_tokens"]
                assert theirs <= ours <= theirs * 1.02, f"{kind}: ours {ours}, server {theirs}"
                assert "x-context-guard-corrected" not in response.headers
                if stream:
                    status, _, text = await ask(session, url, {**request, "stream": True})
                    assert status == 200 and text


class TestCalibrationThroughTheGuard:
    """Waits on wiring: the handler observing each response's usage into a CalibrationTable and
    planning estimates with calibrated(tokenizer, table.get(upstream, model))."""

    async def test_an_unknown_model_is_counted_within_ten_percent_after_a_few_requests(self, aiohttp_server, llama):
        proxy = await start_guard(aiohttp_server, llama)
        url = str(proxy.make_url("/v1/chat/completions"))
        ratios = []
        async with aiohttp.ClientSession() as session:
            for size in (1, 2, 1, 2, 1, 2):
                async with session.post(url, json={**body("english", size, MODEL), "max_tokens": 1}) as response:
                    assert response.status == 200
                    theirs = (await response.json())["usage"]["prompt_tokens"]
                    ratios.append(int(response.headers["x-context-guard-tokens-before"]) / theirs)
        assert all(abs(r - 1) <= 0.1 for r in ratios[4:]), ratios
