"""The whole guard, in process, in front of a real llama.cpp server, as a new user would run it.

Each test builds its own proxy (a fresh guard: nothing learned) in front of the session's server.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from proxy.config.settings import settings_from_dict
from proxy.core.trimming.strategies import DEFAULT_PIPELINE
from proxy.server.backends.models import Models
from proxy.server.process.app import create_app
from tests.real.corpus import KINDS, body, over_window, oversized_system
from tests.real.llama import MODEL, LlamaServer

pytestmark = pytest.mark.real


async def start_guard(
    aiohttp_server: Any, llama: LlamaServer, sections: dict[str, Any] | None = None, **upstream: Any
) -> Any:
    upstreams = {"llama": {"base_url": llama.url, "kind": "auto", "read_timeout": 300, **upstream}}
    settings = settings_from_dict({"upstreams": upstreams, **(sections or {})}, "real.yaml", {})
    return await aiohttp_server(create_app(settings, Models(settings)))


# Longer than the guard's own read timeout (300 s): on a loaded machine one near-window prefill can
# take minutes, and the guard, not this client, must be the one that decides a request took too long.
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=None, sock_read=600)


async def ask(session: aiohttp.ClientSession, url: str, request: dict[str, Any]) -> tuple[int, dict[str, str], str]:
    """POST `request`; the status, the headers, and the completion's text ("" when there is none)."""
    async with session.post(url, json=request, timeout=CLIENT_TIMEOUT) as response:
        raw = await response.read()
        headers = dict(response.headers)
        if response.status != 200:
            return response.status, headers, raw.decode("utf-8", "replace")
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
    """As a new user runs it: `kind: auto`, nothing configured. An over-window stream that
    llama-cpp-python answers with an empty 200 is probed, corrected and retried before the
    client sees a byte; every conversation ends in a completion."""

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


class TestASystemPromptOverTheWindow:
    """A system prompt longer than the window by itself: no cut the default pipeline permits can
    fit it (the system prompt is pinned), so the guard says so plainly; allowed to shrink it
    (`shrink_system`), the guard cuts its middle and the server answers."""

    async def test_is_refused_with_the_numbers_by_default(self, aiohttp_server, llama):
        proxy = await start_guard(aiohttp_server, llama)
        async with aiohttp.ClientSession() as session:
            status, _, text = await ask(session, str(proxy.make_url("/v1/chat/completions")), oversized_system(MODEL))
        assert status == 400 and "maximum context length is" in text  # the provider's own sentence first
        assert "input budget is" in text and "context window 2,0" in text  # then the guard's numbers

    async def test_is_cut_in_the_middle_and_answered_once_shrink_system_is_allowed(self, aiohttp_server, llama):
        sections = {"trim": {"pipeline": [*DEFAULT_PIPELINE, "shrink_system"]}}
        proxy = await start_guard(aiohttp_server, llama, sections)
        async with aiohttp.ClientSession() as session:
            status, headers, text = await ask(
                session, str(proxy.make_url("/v1/chat/completions")), oversized_system(MODEL)
            )
        assert status == 200 and text, text
        assert int(headers["x-context-guard-removed"]) >= 1


class TestALargeMaxTokens:
    """llama-cpp-python lowers `max_tokens` to what the window leaves: the guard, knowing the
    window, must not refuse what the server would serve."""

    async def test_a_short_prompt_with_max_tokens_4096_is_answered(self, aiohttp_server, llama):
        sections = {"models": {"overrides": [{"match": MODEL, "context_window": llama.n_ctx}]}}
        proxy = await start_guard(aiohttp_server, llama, sections)
        request = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4096}
        async with aiohttp.ClientSession() as session:
            status, _, text = await ask(
                session, str(proxy.make_url("/v1/chat/completions")), {**request, "stop": ["\n"]}
            )
        assert status == 200 and text, text


class TestWithTheBackendTokenizer:
    """`upstreams.<name>.tokenize: backend`: every text of what is sent, a trim's shortened
    message and its marker included, is counted by the server's own tokenizer. Each over-window
    conversation is asked once whole (the count checked against `usage`), then streamed."""

    async def test_every_request_fits_within_two_percent_never_under_and_streams_are_answered(
        self, aiohttp_server, llama
    ):
        # Generous deadlines: this test is about the counts, and the shared CI cores are slow.
        deadlines = {"tokenize_timeout": 30, "framing_timeout": 120}
        proxy = await start_guard(aiohttp_server, llama, kind="llamacpp", tokenize="backend", **deadlines)
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
                status, _, text = await ask(session, url, {**request, "stream": True})
                assert status == 200 and text


class TestCalibrationThroughTheGuard:
    """An unknown model counted by the estimate (`tokenize: local`: the server's tokenizer not
    used) is brought within 10% of the server's count by the usage of a few responses."""

    async def test_an_unknown_model_is_counted_within_ten_percent_after_a_few_requests(self, aiohttp_server, llama):
        proxy = await start_guard(aiohttp_server, llama, tokenize="local")
        url = str(proxy.make_url("/v1/chat/completions"))
        ratios = []
        async with aiohttp.ClientSession() as session:
            for size in (1, 2, 1, 2, 1, 2):
                async with session.post(url, json={**body("english", size, MODEL), "max_tokens": 1}) as response:
                    assert response.status == 200
                    theirs = (await response.json())["usage"]["prompt_tokens"]
                    ratios.append(int(response.headers["x-context-guard-tokens-before"]) / theirs)
        assert abs(ratios[0] - 1) > 0.1, f"the uncalibrated estimate was already close: {ratios}"
        assert all(abs(r - 1) <= 0.1 for r in ratios[4:]), ratios
