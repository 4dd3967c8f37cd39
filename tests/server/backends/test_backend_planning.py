"""Planning for a backend, through the real app in front of an in-process imitation of
llama-cpp-python: counts by its own tokenizer to the end, the output it will really leave, and
reports that say what happened.

The imitation counts a token per word (`/extras/tokenize/count`), renders ChatML (three tokens
around each message, two to prime the reply), words its overflow errors as OpenAI does, answers
an over-window stream with an empty 200, and, like llama-cpp-python, lowers `max_tokens` to what
the window leaves instead of refusing it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.server.conftest import gateway_settings
from tests.support.llama import LlamaLike, post, serve

WINDOW = 1200
MODEL = "smol"


def words(text: str) -> int:
    return len(text.split())


class LlamaCppPythonLike(LlamaLike):
    window = WINDOW

    @staticmethod
    def count(body: dict[str, Any]) -> int:
        return sum(3 + words(m.get("content") or "") for m in body["messages"]) + 2

    def overflow(self, body: dict[str, Any], prompt: int) -> dict[str, Any]:
        asked = prompt + body.get("max_tokens", 16)
        message = (
            f"This model's maximum context length is {self.window} tokens. However, you requested {asked} tokens "
            f"({prompt} in the messages, {asked - prompt} in the completion). Please reduce the length of "
            "the messages or completion."
        )
        return {"message": message, "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}  # fmt: skip

    async def tokenize_count(self, request: web.Request) -> web.Response:
        return web.json_response({"count": words((await request.json())["input"])})

    def app(self) -> web.Application:
        app = super().app()
        app.router.add_post("/extras/tokenize/count", self.tokenize_count)
        return app


@pytest.fixture
async def llama(aiohttp_server: Any) -> tuple[LlamaCppPythonLike, str]:
    return await serve(aiohttp_server, LlamaCppPythonLike())


def settings(url: str, window: int | None = None, **upstream: Any) -> Any:
    overrides = [{"match": MODEL, "context_window": window}] if window else []
    return gateway_settings(
        url,
        upstreams={"llama": {"base_url": url, "kind": "auto", "read_timeout": 5, **upstream}},
        models={"overrides": overrides},
    )


def long_chat(turns: int = 5, length: int = 300) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "be brief"}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"question {i} " + "about rivers and lakes " * (length // 4)})
        messages.append({"role": "assistant", "content": f"answer {i} " + "water flows to the sea " * (length // 5)})
    return [*messages, {"role": "user", "content": "thanks"}]


class TestCountingWithTheBackendTokenizer:
    async def test_a_message_the_trim_shortened_is_counted_by_the_backend_too(self, start_proxy, llama, logs):
        _, url = llama
        proxy = await start_proxy(settings(url, WINDOW, tokenize="backend"))
        status, raw, headers = await post(proxy, {"model": MODEL, "messages": long_chat(), "max_tokens": 16})
        assert status == 200, raw
        [event] = logs.events("request")
        assert event["cut"]["partial_index"] is not None  # the case this is about
        assert int(headers["x-context-guard-tokens-after"]) == json.loads(raw)["usage"]["prompt_tokens"]
        assert event["count_source"] == "backend" and "estimate" not in event.get("notes", [])


class TestOutputReserve:
    async def test_a_short_prompt_with_a_large_max_tokens_is_served_by_a_server_that_lowers_it(
        self, start_proxy, llama, logs
    ):
        fake, url = llama
        proxy = await start_proxy(settings(url, 2048))
        request = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4096}
        status, raw, _ = await post(proxy, request)
        assert status == 200, raw
        assert fake.received[-1]["max_tokens"] == 4096  # sent as asked: the server lowers it
        [event] = logs.events("request")
        assert event["outcome"] == "unchanged" and event["output_reserve"] < 2048

    async def test_a_long_prompt_is_cut_to_leave_the_configured_minimum_output(self, start_proxy, llama, logs):
        _, url = llama
        proxy = await start_proxy(settings(url, WINDOW, tokenize="backend", min_output_tokens=100))
        status, raw, headers = await post(proxy, {"model": MODEL, "messages": long_chat(), "max_tokens": 4096})
        assert status == 200, raw
        [event] = logs.events("request")
        prompt = int(headers["x-context-guard-tokens-after"])
        assert event["outcome"] == "trimmed" and 100 <= event["output_reserve"] <= WINDOW - prompt

    async def test_a_server_that_must_fit_the_output_still_refuses_it(self, start_proxy, llama):
        _, url = llama
        proxy = await start_proxy(settings(url, 2048, kind="vllm"))  # a declared kind is trusted
        request = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4096}
        status, raw, _ = await post(proxy, request)
        assert status == 400 and json.loads(raw)["error"]["code"] == "context_length_exceeded"


class TestHonestReports:
    async def test_a_correction_names_the_upstream_s_kind_not_the_wording_of_its_error(self, start_proxy, llama, logs):
        _, url = llama
        proxy = await start_proxy(settings(url))
        for _ in range(2):
            status, raw, _ = await post(proxy, {"model": MODEL, "messages": long_chat(), "max_tokens": 16})
            assert status == 200, raw
        first, second = logs.events("request")
        assert first["self_correction"]["provider"] == "llamacpp"
        assert second["applied_correction"]["provider"] == "llamacpp"

    async def test_once_a_correction_gives_the_window_it_is_not_called_a_fallback(self, start_proxy, llama, logs):
        _, url = llama
        proxy = await start_proxy(settings(url))
        for _ in range(2):
            await post(proxy, {"model": MODEL, "messages": long_chat(), "max_tokens": 16})
        for event in logs.events("request"):
            assert event["window_source"] == "correction" and "fallback_window" not in event.get("notes", [])

    async def test_a_stream_the_client_closes_after_its_end_is_a_success(self, start_proxy, llama, logs):
        fake, url = llama
        fake.linger = 1.0  # the upstream keeps the connection open after [DONE]; the client does not wait
        proxy = await start_proxy(settings(url, WINDOW))
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        async with aiohttp.ClientSession() as session:
            async with session.post(proxy.make_url("/v1/chat/completions"), json=body) as response:
                async for line in response.content:
                    if line.strip() == b"data: [DONE]":
                        break
        [event] = await asyncio.wait_for(logs.written("request"), 30)
        assert event["status"] == 200 and "client_disconnected" not in event and event["outcome"] == "unchanged"

    async def test_a_rejection_states_the_numbers_plainly(self, start_proxy, llama):
        _, url = llama
        proxy = await start_proxy(settings(url, WINDOW))
        system = {"role": "system", "content": "rule " * 1500}
        status, raw, _ = await post(proxy, {"model": MODEL, "messages": [system, {"role": "user", "content": "hi"}]})
        message = json.loads(raw)["error"]["message"]
        assert status == 400
        assert "input tokens" in message and f"context window {WINDOW:,}" in message
        assert "input budget is" in message and "Shorten the system prompt" in message


class CharacterTokenizerLike(LlamaCppPythonLike):
    """Two tokens a character, role names too: far more than any local estimate of CJK text (as a
    small model's vocabulary can be), so every text a trim makes is undercounted, and every cut
    placed by estimated positions, until the backend counts it."""

    @staticmethod
    def count(body: dict[str, Any]) -> int:
        return sum(1 + 2 * len(m["role"]) + 2 * len(m.get("content") or "") for m in body["messages"]) + 2

    async def tokenize_count(self, request: web.Request) -> web.Response:
        return web.json_response({"count": 2 * len((await request.json())["input"])})


def cjk_chat(turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "简短回答"}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"问题{i}:" + "河流和湖泊的水从哪里来" * (8 + i)})
        messages.append({"role": "assistant", "content": f"回答{i}:" + "水从山上流到大海里去" * (9 + i)})
    return [*messages, {"role": "user", "content": "谢谢"}]


class TestTextsTheBackendHasNotCountedYet:
    async def test_the_count_reported_is_never_under_the_servers_whatever_the_estimate(
        self, start_proxy, aiohttp_server, logs
    ):
        _, url = await serve(aiohttp_server, CharacterTokenizerLike())
        proxy = await start_proxy(settings(url, WINDOW, tokenize="backend"))
        for turns in range(3, 9):
            status, raw, headers = await post(proxy, {"model": MODEL, "messages": cjk_chat(turns), "max_tokens": 16})
            assert status == 200, raw
            theirs = json.loads(raw)["usage"]["prompt_tokens"]
            assert theirs <= int(headers["x-context-guard-tokens-after"]) <= theirs * 1.02, turns
        assert {e["count_source"] for e in logs.events("request")} == {"backend"}
