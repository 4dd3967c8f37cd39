"""The provider's own count on every request's log line, whatever the API and whether it streamed:
chat completions, Responses, Anthropic Messages and Gemini, each answered by a fake provider in
its own spelling of usage; and how each spelling is read (`proxy.server.upstream.usage`)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from proxy.server.upstream.usage import HeldReport, Reported, reported_from_body, usage_of
from tests.server.conftest import gateway_settings
from tests.support.gemini_upstream import FakeGemini, independent_count
from tests.support.upstream import FakeUpstream

QUESTION = "What is the tallest mountain in the Alps, and how tall is it?"


@pytest.fixture
async def provider(aiohttp_server: Any) -> FakeUpstream:
    return await FakeUpstream(every_shape=True).served(aiohttp_server)


def shaped(api: str, stream: bool) -> tuple[str, dict[str, Any]]:
    """The path and body of one question in `api`'s shape."""
    if api == "chat":
        body: dict[str, Any] = {"model": "gpt-4o", "messages": [{"role": "user", "content": QUESTION}]}
        if stream:
            body["stream_options"] = {"include_usage": True}
        path = "/v1/chat/completions"
    elif api == "responses":
        body, path = {"model": "gpt-4o", "input": QUESTION}, "/v1/responses"
    else:
        body = {"model": "claude-sonnet-4-6", "max_tokens": 100, "messages": [{"role": "user", "content": QUESTION}]}
        path = "/v1/messages"
    return path, {**body, "stream": stream}


class TestTheLogLineCarriesTheProvidersCount:
    @pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
    @pytest.mark.parametrize("api", ["chat", "responses", "messages"])
    async def test_openai_and_anthropic_shapes(self, start_proxy, provider, logs, api, stream):
        proxy = await start_proxy(gateway_settings(provider.url))
        path, body = shaped(api, stream)
        async with aiohttp.ClientSession() as session:
            async with session.post(proxy.make_url(path), json=body, headers={"x-api-key": "k"}) as response:
                assert response.status == 200
                await response.read()
        (line,) = await logs.written("request")
        expected = {"chat": provider.provider_count(body) if stream else 10, "messages": 10}
        expected["responses"] = provider.stored.counted[-1] if provider.stored.counted else -1
        assert line["provider_prompt_tokens"] == expected[api]
        assert line["provider_output_tokens"] >= 1
        assert line["provider_prompt_tokens"] <= line["tokens_after"] * 1.5  # beside the guard's own count

    @pytest.mark.parametrize("method", ["generateContent", "streamGenerateContent?alt=sse", "streamGenerateContent"])
    async def test_gemini(self, aiohttp_server, start_proxy, logs, method):
        fake = FakeGemini()
        root = str((await aiohttp_server(fake.app())).make_url("")).rstrip("/")
        upstream = {"base_url": root, "kind": "gemini", "read_timeout": 5, "connect_timeout": 2}
        proxy = await start_proxy(gateway_settings(root, upstreams={"google": upstream}))
        body = {"contents": [{"role": "user", "parts": [{"text": QUESTION}]}]}
        url = proxy.make_url(f"/v1beta/models/gemini-2.5-flash:{method}")
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json=body, headers={"x-goog-api-key": "k"}) as response:
                assert response.status == 200
                await response.read()
        (line,) = await logs.written("request")
        assert line["provider_prompt_tokens"] == independent_count(body)
        assert line["provider_output_tokens"] == 3


class TestThePageCarriesTheProvidersCount:
    async def test_each_row_has_the_upstreams_prompt_tokens_beside_the_guards(self, start_proxy, provider, logs):
        proxy = await start_proxy(gateway_settings(provider.url))
        path, body = shaped("responses", False)
        async with aiohttp.ClientSession() as session:
            async with session.post(proxy.make_url(path), json=body, headers={"x-api-key": "k"}) as response:
                assert response.status == 200
            await logs.written("request")
            async with session.get(proxy.make_url("/context-guard/recent.json")) as response:
                (row,) = (await response.json())["rows"]
        assert row["provider_prompt_tokens"] == provider.stored.counted[-1]
        assert row["tokens_after"] is not None


class TestEachSpellingOfUsage:
    def test_chat_with_its_cached_tokens(self):
        usage = usage_of(
            {"usage": {"prompt_tokens": 90, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 64}}}
        )
        assert usage is not None and (usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens) == (90, 64, 5)

    def test_responses_counts_its_cached_tokens_within_the_input(self):
        usage = usage_of(
            {
                "object": "response",
                "usage": {"input_tokens": 90, "output_tokens": 5, "input_tokens_details": {"cached_tokens": 64}},
            }
        )
        assert usage is not None and (usage.prompt_tokens, usage.cached_tokens) == (90, 64)

    def test_anthropic_adds_its_cache_reads_and_writes_to_the_input(self):
        """Anthropic's `input_tokens` leaves out what it read from or wrote to its cache."""
        payload = {
            "usage": {
                "input_tokens": 10,
                "cache_read_input_tokens": 80,
                "cache_creation_input_tokens": 5,
                "output_tokens": 7,
            }
        }
        usage = usage_of(payload)
        assert usage is not None and (usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens) == (95, 80, 7)

    def test_an_anthropic_stream_says_the_prompt_first_and_the_output_last(self):
        reported = Reported()
        reported.add(
            {"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": 40, "output_tokens": 1}}}
        )
        reported.add({"type": "message_delta", "usage": {"output_tokens": 25}})
        assert reported.usage is not None and (reported.usage.prompt_tokens, reported.usage.completion_tokens) == (
            40,
            25,
        )

    def test_gemini_usage_metadata(self):
        usage = usage_of(
            {"usageMetadata": {"promptTokenCount": 120, "cachedContentTokenCount": 100, "candidatesTokenCount": 9}}
        )
        assert usage is not None and (usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens) == (
            120,
            100,
            9,
        )

    def test_a_gemini_json_array_stream_reports_its_last_pieces_usage(self):
        body = b'[{"usageMetadata": {"promptTokenCount": 7}}, {"usageMetadata": {"promptTokenCount": 7, "candidatesTokenCount": 4}}]'
        usage = reported_from_body(body).usage
        assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (7, 4)

    @pytest.mark.parametrize(
        "payload", [{"usage": {"input_tokens": True}}, {"usageMetadata": {"promptTokenCount": -1}}, {"usage": None}, []]
    )
    def test_no_count_is_no_usage(self, payload):
        assert usage_of(payload) is None


class TestWhatAnAnswerSaysIsHeld:
    def test_a_completed_response_and_the_conversation_it_joined_weigh_its_input_and_output(self):
        answer = {
            "id": "resp_1",
            "object": "response",
            "status": "completed",
            "conversation": {"id": "conv_1"},
            "usage": {"input_tokens": 900, "output_tokens": 100},
        }
        assert reported_from_body(_json(answer)).held == [
            HeldReport("response", "resp_1", 1000),
            HeldReport("conversation", "conv_1", 1000),
        ]

    def test_the_completed_event_of_a_stream_says_it(self):
        reported = Reported()
        reported.add(
            {
                "type": "response.completed",
                "response": {
                    "id": "resp_2",
                    "object": "response",
                    "status": "completed",
                    "usage": {"input_tokens": 50, "output_tokens": 5},
                },
            }
        )
        assert reported.held == [HeldReport("response", "resp_2", 55)]

    def test_a_response_in_progress_holds_nothing_yet(self):
        answer = {
            "id": "resp_3",
            "object": "response",
            "status": "in_progress",
            "usage": {"input_tokens": 50, "output_tokens": 0},
        }
        assert reported_from_body(_json(answer)).held == []

    def test_a_cached_content_weighs_its_total_until_it_expires(self):
        answer = {
            "name": "cachedContents/abc",
            "usageMetadata": {"totalTokenCount": 20000},
            "expireTime": "2030-01-01T00:00:00.123456789Z",
        }
        (held,) = reported_from_body(_json(answer)).held
        assert (held.kind, held.id, held.tokens) == ("cache", "cachedContents/abc", 20000)
        assert held.expires_at == pytest.approx(1893456000.123456)

    def test_an_interaction_weighs_its_input_and_output(self):
        answer = {
            "id": "int_1",
            "status": "completed",
            "usage": {"total_input_tokens": 300, "total_output_tokens": 20, "total_tokens": 320},
        }
        assert reported_from_body(_json(answer)).held == [HeldReport("interaction", "int_1", 320)]

    def test_a_chat_completion_holds_nothing(self):
        assert (
            reported_from_body(
                _json({"id": "chatcmpl-1", "object": "chat.completion", "usage": {"prompt_tokens": 5}})
            ).held
            == []
        )


def _json(value: object) -> bytes:
    return json.dumps(value).encode()
