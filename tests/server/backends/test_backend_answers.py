"""What the guard does with a backend's answers: an empty stream after the status line, and the
usage it reports (calibration), through the real app in front of an in-process llama.cpp-like fake."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.server.conftest import gateway_settings, long_conversation
from tests.support.llama import WINDOW, LlamaLike, post, serve


@pytest.fixture
async def llama(aiohttp_server: Any) -> tuple[LlamaLike, str]:
    return await serve(aiohttp_server, LlamaLike())


class TestAnEmptyStreamAfterTheStatusLine:
    async def test_is_probed_corrected_and_retried_before_the_client_sees_a_byte(self, start_proxy, llama, logs):
        fake, url = llama
        proxy = await start_proxy(gateway_settings(url, upstreams={"fake": {"base_url": url, "kind": "llamacpp"}}))
        status, body, _ = await post(proxy, {"model": "local-model", "messages": long_conversation(), "stream": True})
        assert status == 200 and b'"ok"' in body and b"[DONE]" in body
        streamed = [b for b in fake.received if b.get("stream")]
        assert len(streamed) == 2 and LlamaLike.count(streamed[-1]) <= WINDOW  # the retry fitted
        assert [b.get("max_tokens") for b in fake.received if not b.get("stream")] == [1]  # the probe
        event = logs.events("request")[-1]
        assert "empty_stream" in event["notes"] and event["self_correction"]["provider"] == "llamacpp"

    async def test_a_generic_upstream_s_empty_stream_is_a_proper_error_not_an_empty_200(
        self, start_proxy, llama, logs
    ):
        _, url = llama
        proxy = await start_proxy(gateway_settings(url))
        status, body, _ = await post(proxy, {"model": "local-model", "messages": long_conversation(), "stream": True})
        assert status == 502 and json.loads(body)["error"]["code"] == "upstream_unavailable"


class TestCalibrationFromUsage:
    async def test_an_estimate_learns_the_servers_count_and_is_scaled_by_it(self, start_proxy, llama, logs):
        _, url = llama
        proxy = await start_proxy(gateway_settings(url))
        short = [{"role": "user", "content": "tell me about rivers " * 40}]
        for _ in range(2):
            status, _, _ = await post(proxy, {"model": "local-model", "messages": short})
            assert status == 200
        first, second = logs.events("request")[-2:]
        assert first["count_source"] == "estimate" and first["provider_prompt_tokens"] > 0
        assert second["count_source"] == "calibrated" and second["calibration"] > 0
        assert abs(second["tokens_before"] - second["provider_prompt_tokens"]) <= 0.1 * second["provider_prompt_tokens"]

    async def test_a_request_with_a_field_the_guard_cannot_count_teaches_nothing(self, start_proxy, llama, logs):
        """Its usage is true, but about that request: one client's documents must not scale every
        other client's estimate."""
        _, url = llama
        proxy = await start_proxy(gateway_settings(url))
        short = [{"role": "user", "content": "tell me about rivers " * 40}]
        documents = [{"title": "notes", "text": "x" * 4000}]
        for body in ({"messages": short}, {"messages": short, "rag_context": documents}, {"messages": short}):
            assert (await post(proxy, {"model": "local-model", **body}))[0] == 200
        _, with_documents, after = logs.events("request")[-3:]
        # The same messages, counted as the first request taught: the documents taught nothing.
        assert after["count_source"] == "calibrated" and after["tokens_before"] == with_documents["tokens_before"]
        assert with_documents["provider_prompt_tokens"] > 2 * with_documents["tokens_before"]
        assert with_documents["unread_fields"] == ["rag_context"]
