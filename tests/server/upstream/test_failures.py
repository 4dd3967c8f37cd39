"""Bad input and failing upstreams: every case is an OpenAI-shaped error, never a traceback."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

import aiohttp
import openai
import pytest

from bench.processes import free_port
from proxy.server.threads.placement import FairSlots
from tests.server.conftest import gateway_settings, long_conversation


def assert_openai_error(payload: dict, code: str | None) -> None:
    assert set(payload) == {"error"}
    assert set(payload["error"]) == {"message", "type", "param", "code"}
    assert payload["error"]["code"] == code and payload["error"]["message"]
    assert "Traceback" not in payload["error"]["message"]


async def post(proxy, data: bytes, headers: dict | None = None):
    async with aiohttp.ClientSession() as session:
        async with session.post(proxy.make_url("/v1/chat/completions"), data=data, headers=headers or {}) as r:
            return r.status, await r.json(content_type=None), r.headers


class TestBadInput:
    @pytest.mark.parametrize(
        ("data", "code", "param", "fragment"),
        [
            (b"{not json", "invalid_request", None, "not valid JSON"),
            (b"[1, 2, 3]", "invalid_request", None, "JSON object"),
            (b'{"model": "gpt-4"}', "invalid_request", "messages", "'messages' is required"),
            (b'{"model": "gpt-4", "messages": []}', "invalid_request", "messages", "must not be empty"),
            (
                b'{"model": "gpt-4", "messages": [{"content": "no role"}]}',
                "invalid_request",
                "messages[0]",
                "string 'role'",
            ),
            (b'{"messages": [{"role": "user", "content": "hi"}]}', "invalid_request", "model", "'model' is required"),
            (b"\xff\xfe\x00garbage", "invalid_request", None, "not valid JSON"),
        ],
    )
    async def test_gets_a_400_that_says_what_is_wrong(self, proxy, upstream, data, code, param, fragment):
        status, payload, headers = await post(proxy, data)
        assert status == 400 and headers["x-request-id"]
        assert_openai_error(payload, code)
        assert payload["error"]["param"] == param and fragment in payload["error"]["message"]
        assert upstream.received == []

    async def test_a_body_over_the_limit_gets_413(self, start_proxy, upstream):
        proxy = await start_proxy(gateway_settings(upstream.url, server={"max_body_bytes": 4096}))
        status, payload, _ = await post(
            proxy, json.dumps({"model": "gpt-4", "messages": [{"role": "user", "content": "x" * 10000}]}).encode()
        )
        assert status == 413
        assert_openai_error(payload, "request_too_large")

    async def test_a_model_no_route_serves_gets_404(self, start_proxy, upstream):
        proxy = await start_proxy(gateway_settings(upstream.url, routes=[{"match": "gpt-*", "upstream": "fake"}]))
        status, payload, _ = await post(
            proxy, b'{"model": "claude-3-opus", "messages": [{"role": "user", "content": "hi"}]}'
        )
        assert status == 404
        assert_openai_error(payload, "model_not_found")

    async def test_a_request_that_cannot_fit_is_rejected_as_context_length_exceeded(self, proxy, upstream):
        body = {
            "model": "gpt-4",
            "messages": [{"role": "system", "content": "rule " * 9000}, {"role": "user", "content": "hi"}],
        }
        status, payload, headers = await post(proxy, json.dumps(body).encode())
        assert status == 400
        assert_openai_error(payload, "context_length_exceeded")
        assert "input budget is 6,554 tokens" in payload["error"]["message"] and payload["error"]["param"] == "messages"
        assert int(headers["x-context-guard-tokens-before"]) > 9000
        assert upstream.received == []

    async def test_the_sdk_raises_its_own_bad_request_error(self, proxy):
        client = openai.AsyncOpenAI(base_url=str(proxy.make_url("/v1")), api_key="k", max_retries=0)
        with pytest.raises(openai.BadRequestError) as caught:
            await client.chat.completions.create(
                model="gpt-4", messages=[{"role": "system", "content": "rule " * 9000}]
            )
        assert caught.value.code == "context_length_exceeded"


class TestFailingUpstreams:
    async def test_a_refused_connection_gets_502(self, start_proxy):
        port = free_port()  # nothing listens on it
        proxy = await start_proxy(gateway_settings(f"http://127.0.0.1:{port}/v1"))
        status, payload, _ = await post(proxy, b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}')
        assert status == 502
        assert_openai_error(payload, "upstream_unavailable")

    async def test_an_upstream_that_does_not_answer_in_time_gets_504(self, start_proxy, upstream):
        upstream.delay = 2.0
        settings = gateway_settings(upstream.url)
        settings = gateway_settings(upstream.url, upstreams={"fake": {"base_url": upstream.url, "read_timeout": 0.3}})
        proxy = await start_proxy(settings)
        status, payload, _ = await post(proxy, b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}')
        assert status == 504
        assert_openai_error(payload, "upstream_timeout")

    async def test_upstream_errors_pass_through_with_their_status_body_and_headers(self, proxy, upstream):
        error = {
            "error": {"message": "Rate limit reached", "type": "requests", "param": None, "code": "rate_limit_exceeded"}
        }
        upstream.fail_with = (429, error)
        status, payload, headers = await post(
            proxy, b'{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}'
        )
        assert (status, payload, headers["retry-after"]) == (429, error, "7")
        assert len(upstream.received) == 1  # not an overflow: no retry


class TestStreamingFailures:
    async def test_a_client_that_disconnects_mid_stream_cancels_the_upstream_call(self, proxy, upstream):
        upstream.stream_chunks, upstream.chunk_delay = 200, 0.05
        body = json.dumps({"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
        session = aiohttp.ClientSession()
        response = await session.post(proxy.make_url("/v1/chat/completions"), data=body)
        await response.content.readline()  # the first chunk has arrived
        response.close()  # the client goes away
        await session.close()
        await asyncio.wait_for(upstream.stream_cancelled.wait(), timeout=5)

    async def test_an_upstream_that_breaks_mid_stream_ends_the_client_stream_cleanly(self, proxy, upstream, logs):
        upstream.stream_chunks, upstream.break_stream_after = 10, 3
        body = json.dumps({"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}]})
        async with aiohttp.ClientSession() as session:
            async with session.post(proxy.make_url("/v1/chat/completions"), data=body) as r:
                text = (await r.read()).decode()  # completes: the chunked stream was terminated properly
        assert r.status == 200 and text.count("part") == 3
        last = [line for line in text.splitlines() if line.startswith("data: ")][-1]
        assert json.loads(last[6:])["error"]["code"] == "upstream_stream_broken"
        assert "ended the stream early" in logs.events("request")[0]["stream_broken"]

    async def test_the_sdk_sees_a_broken_stream_as_an_api_error(self, proxy, upstream):
        upstream.stream_chunks, upstream.break_stream_after = 10, 2
        client = openai.AsyncOpenAI(base_url=str(proxy.make_url("/v1")), api_key="k", max_retries=0)
        stream = await client.chat.completions.create(
            model="gpt-4o", stream=True, messages=[{"role": "user", "content": "hi"}]
        )
        with pytest.raises(openai.APIError):
            async for _ in stream:
                pass


class TestLargeBodies:
    async def test_counting_a_10mb_body_does_not_stall_other_requests(self, proxy, upstream, monkeypatch):
        """While a 10 MB body's work is held in its thread, /healthz is answered; then the body is."""
        messages = long_conversation(turns=1200, words=1200)  # ~10 MB of JSON
        body = json.dumps({"model": "gpt-4.1", "messages": messages}).encode()
        assert len(body) > 10_000_000
        loop = asyncio.get_running_loop()
        in_thread, release = asyncio.Event(), threading.Event()
        run = FairSlots.run

        async def held_run(slots: FairSlots, client: str, work: Callable[..., Any], *args: Any) -> Any:
            def held(*call_args: Any) -> Any:
                loop.call_soon_threadsafe(in_thread.set)
                release.wait(60)
                return work(*call_args)

            return await run(slots, client, held, *args)

        monkeypatch.setattr(FairSlots, "run", held_run)
        async with aiohttp.ClientSession() as session:

            async def big() -> int:
                async with session.post(proxy.make_url("/v1/chat/completions"), data=body) as r:
                    return r.status

            counting = asyncio.create_task(big())
            try:
                await asyncio.wait_for(in_thread.wait(), 60)
                for _ in range(3):
                    async with session.get(proxy.make_url("/healthz")) as r:
                        assert r.status == 200
                assert not counting.done()
            finally:
                release.set()
            assert await counting == 200
