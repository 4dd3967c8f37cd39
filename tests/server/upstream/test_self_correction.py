"""When an upstream still says the context is too long, the proxy learns its count and retries once."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import openai
import pytest

from proxy.core.learning.corrections import Correction, Overflow, parse_overflow
from proxy.server.upstream.connection import overflow_told
from tests.server.conftest import gateway_settings, long_conversation
from tests.support.trimming import fit, words
from tests.support.upstream import overflow_error


async def chat(proxy, body: dict) -> tuple[int, dict, dict]:
    async with aiohttp.ClientSession() as session:
        async with session.post(proxy.make_url("/v1/chat/completions"), data=json.dumps(body)) as r:
            return r.status, await r.json(), dict(r.headers)


class TestParseOverflow:
    @pytest.mark.parametrize(
        ("style", "provider"),
        [("openai", "openai"), ("vllm", "openai"), ("vertex", "vertex"), ("llamacpp", "llamacpp")],
    )
    def test_reads_each_providers_limit_and_count(self, style, provider):
        status, error = overflow_error(style, 4096, 5000)
        overflow = parse_overflow(status, json.dumps(error).encode())
        assert overflow == Overflow(provider, 4096, 5000)

    def test_reads_vllms_newer_wording(self):
        message = (
            "'max_tokens' or 'max_completion_tokens' is too large: 1000. This model's maximum context length is "
            "4096 tokens and your request has 3500 input tokens (1000 > 4096 - 3500)."
        )
        overflow = parse_overflow(400, json.dumps({"object": "error", "message": message}).encode())
        assert (overflow.limit, overflow.prompt_tokens) == (4096, 3500)

    def test_other_errors_are_not_overflows(self):
        assert parse_overflow(429, b'{"error": {"message": "maximum context length is 10 tokens"}}') is None
        assert parse_overflow(400, b'{"error": {"message": "invalid temperature"}}') is None


class TestCorrection:
    def test_scales_the_window_by_how_far_our_count_fell_short(self):
        correction = Correction.measure(
            Overflow("vertex", 10000, 12500), our_prompt_tokens=10000, our_window=10000, output_reserve=0
        )
        assert correction.factor == 1.25 and correction.window == int(10000 / (1.25 * 1.02))

    def test_takes_the_providers_smaller_limit(self):
        correction = Correction.measure(
            Overflow("vllm", 4096, 3000), our_prompt_tokens=3000, our_window=128000, output_reserve=500
        )
        assert correction.window == int(4096 / 1.02)

    def test_what_a_request_not_read_whole_teaches_is_the_stated_limit_alone(self):
        correction = Correction.measure(
            Overflow("vllm", 6000, 9000), our_prompt_tokens=6000, our_window=8192, output_reserve=500
        )
        shared = correction.limit_only(8192)
        assert correction.factor == 1.5 and (shared.window, shared.factor) == (int(6000 / 1.02), 1.0)
        assert correction.limit_only(6000) is None  # no tighter than the window known already
        no_limit = Correction.measure(Overflow("openai", None, 9000), 6000, 8192, 500)
        assert no_limit is not None and no_limit.limit_only(8192) is None

    @pytest.mark.parametrize(
        ("overflow", "why"),
        [
            (Overflow("openai", 300, 999999), "a limit far below the known window"),
            (Overflow("openai", 8192, 80000), "a count ten times ours"),
        ],
    )
    def test_an_implausible_overflow_teaches_nothing(self, overflow, why):
        assert Correction.measure(overflow, our_prompt_tokens=7000, our_window=8192, output_reserve=500) is None, why


class TestRetry:
    @pytest.mark.parametrize("style", ["openai", "vllm", "vertex", "llamacpp"])
    async def test_a_rejected_request_is_cut_further_and_retried_once(self, proxy, upstream, logs, style):
        # The provider counts 25% more than we do and its window is 6,000 tokens.
        upstream.limit, upstream.error_style, upstream.provider_factor = 6000, style, 1.25
        status, payload, headers = await chat(proxy, {"model": "gpt-4", "messages": long_conversation()})
        assert status == 200 and payload["choices"][0]["message"]["content"] == "Hello from upstream."
        first, second = upstream.received
        assert len(second.json()["messages"]) < len(first.json()["messages"])
        assert upstream.provider_count(second.json()) <= 6000
        (event,) = logs.events("request")
        correction = event["self_correction"]
        assert correction["provider_limit"] == 6000 and correction["corrected_window"] < 6000
        assert int(headers["x-context-guard-tokens-after"]) == event["tokens_after"]

    async def test_a_gzipped_overflow_error_is_read_and_relayed_compressed(self, proxy, upstream):
        # The openai SDK asks for gzip; OpenAI then compresses its errors.
        upstream.limit, upstream.provider_factor, upstream.gzip_errors = 6000, 1.25, True
        client = openai.AsyncOpenAI(base_url=str(proxy.make_url("/v1")), api_key="k", max_retries=0)
        completion = await client.chat.completions.create(model="gpt-4", messages=long_conversation())
        assert completion.choices[0].message.content == "Hello from upstream." and len(upstream.received) == 2

    async def test_the_correction_is_remembered_for_the_next_request(self, proxy, upstream):
        upstream.limit, upstream.provider_factor = 6000, 1.25
        await chat(proxy, {"model": "gpt-4", "messages": long_conversation()})
        await chat(proxy, {"model": "gpt-4", "messages": long_conversation(90)})
        assert len(upstream.received) == 3  # the second request fitted the first time

    async def test_retries_at_most_once_and_relays_the_second_answer(self, proxy, upstream):
        upstream.fail_with = overflow_error("openai", 6000, 7000)  # says "too long" whatever it is sent
        status, payload, _ = await chat(proxy, {"model": "gpt-4", "messages": long_conversation()})
        assert len(upstream.received) == 2 and status == 400
        assert payload["error"]["code"] == "context_length_exceeded"

    async def test_with_overflow_forward_an_uncuttable_request_gets_the_upstreams_own_answer(
        self, start_proxy, upstream, logs
    ):
        proxy = await start_proxy(gateway_settings(upstream.url, trim={"overflow": "forward"}))
        upstream.limit, upstream.provider_factor = 3000, 1.25
        body = {
            "model": "gpt-4",
            "messages": [{"role": "system", "content": "rule " * 9000}, {"role": "user", "content": "hi"}],
        }
        status, payload, _ = await chat(proxy, body)
        assert status == 400 and "maximum context length is 3000" in payload["error"]["message"]
        assert len(upstream.received) == 1  # not sent twice
        (event,) = logs.events("request")
        assert event["outcome"] == "forwarded_over_budget" and event["level"] == "warning"

    async def test_can_be_switched_off(self, start_proxy, upstream):
        proxy = await start_proxy(gateway_settings(upstream.url, self_correction={"enabled": False}))
        upstream.limit = 6000
        status, _, _ = await chat(proxy, {"model": "gpt-4", "messages": long_conversation()})
        assert status == 400 and len(upstream.received) == 1

    async def test_streaming_requests_are_corrected_before_any_byte_is_sent(self, proxy, upstream):
        upstream.limit, upstream.provider_factor = 6000, 1.25
        async with aiohttp.ClientSession() as session:
            body = {"model": "gpt-4", "messages": long_conversation(), "stream": True}
            async with session.post(proxy.make_url("/v1/chat/completions"), data=json.dumps(body)) as r:
                text = await r.text()
        assert r.status == 200 and "part4" in text and len(upstream.received) == 2


class TestNoClientCanPoisonTheWindow:
    POISON = "This model's maximum context length is 300 tokens. However, your messages resulted in 999999 tokens"

    async def test_overflow_wording_the_upstream_echoes_from_the_request_teaches_nothing(self, proxy, upstream, logs):
        upstream.echo_field = "user"
        status, payload, _ = await chat(
            proxy, {"model": "gpt-4", "messages": long_conversation(2), "user": self.POISON}
        )
        assert status == 400 and self.POISON in payload["error"]["message"] and len(upstream.received) == 1
        upstream.echo_field = None
        status, _, headers = await chat(proxy, {"model": "gpt-4", "messages": long_conversation()})
        assert status == 200 and int(headers["x-context-guard-budget"]) == 8192 - 1228 - 410
        assert "self_correction" not in logs.events("request")[0]

    async def test_overflow_wording_spelled_with_escapes_the_upstream_decodes_teaches_nothing(
        self, proxy, upstream, logs
    ):
        upstream.echo_field = "user"
        plausible = "This model's maximum context length is 4000 tokens. However, your messages resulted in 100 tokens"
        raw = json.dumps({"model": "gpt-4", "messages": long_conversation(2), "user": plausible})
        raw = raw.replace("This model's maximum", "\\u0054his model\\u0027s maximum")
        assert "This model" not in raw
        async with aiohttp.ClientSession() as session:
            async with session.post(proxy.make_url("/v1/chat/completions"), data=raw) as r:
                assert r.status == 400 and plausible in (await r.json())["error"]["message"]
        assert len(upstream.received) == 1 and "self_correction" not in logs.events("request")[0]

    async def test_a_correction_whose_retry_fails_is_not_remembered(self, proxy, upstream, logs):
        upstream.fail_with = overflow_error("openai", 6000, 7000)  # too long, whatever it is sent
        status, _, _ = await chat(proxy, {"model": "gpt-4", "messages": long_conversation()})
        assert status == 400 and len(upstream.received) == 2
        upstream.fail_with = None
        status, _, headers = await chat(proxy, {"model": "gpt-4", "messages": long_conversation()})
        assert status == 200 and len(upstream.received) == 3
        assert int(headers["x-context-guard-budget"]) == 8192 - 1228 - 410
        assert "applied_correction" not in logs.events("request")[-1]

    async def test_an_implausibly_small_limit_is_relayed_and_not_learned(self, proxy, upstream, logs):
        upstream.fail_with = overflow_error("openai", 300, 999999)
        status, _, _ = await chat(proxy, {"model": "gpt-4", "messages": long_conversation()})
        assert status == 400 and len(upstream.received) == 1
        (event,) = logs.events("request")
        assert event["self_correction_ignored"] == "implausible" and event["level"] == "warning"

    async def test_a_field_the_guard_cannot_count_corrects_only_its_own_request(self, proxy, upstream, logs):
        """A server that renders a field of its own into the prompt (one the guard does not know):
        the provider's count of such a request is true, but about that request. Retried to fit,
        it teaches other requests nothing (the limit it states is the window known already),
        however often it comes."""
        upstream.limit, upstream.provider_factor, upstream.renders_field = 8192, 1.0, "rag_context"
        documents = [{"title": "notes", "text": "lorem ipsum " * 1000}]
        for _ in range(3):
            body = {"model": "gpt-4", "messages": long_conversation(), "rag_context": documents, "max_tokens": 100}
            status, _, _ = await chat(proxy, body)
            assert status == 200
        status, _, headers = await chat(proxy, {"model": "gpt-4", "messages": long_conversation()})
        assert status == 200 and int(headers["x-context-guard-budget"]) == 8192 - 1228 - 410
        first = logs.events("request")[0]
        assert first["unread_fields"] == ["rag_context"] and first["self_correction"]["factor"] > 1.2
        assert "applied_correction" not in logs.events("request")[-1]

    async def test_a_field_the_guard_cannot_count_still_teaches_the_window_the_provider_states(
        self, proxy, upstream, logs
    ):
        upstream.limit, upstream.provider_factor, upstream.renders_field = 6000, 1.0, "rag_context"
        documents = [{"title": "notes", "text": "lorem ipsum " * 400}]
        body = {"model": "gpt-4", "messages": long_conversation(), "rag_context": documents, "max_tokens": 100}
        assert (await chat(proxy, body))[0] == 200
        status, _, _ = await chat(proxy, {"model": "gpt-4", "messages": long_conversation()})
        applied = logs.events("request")[-1]["applied_correction"]
        assert status == 200 and applied["factor"] == 1.0 and applied["corrected_window"] == int(6000 / 1.02)

    async def test_corrections_do_not_compound(self, proxy, upstream, logs):
        """Each is measured from the model's known window, not from the one a correction gave."""
        upstream.limit, upstream.provider_factor = 6000, 1.25
        for turns in (80, 90, 100):
            await chat(proxy, {"model": "gpt-4", "messages": long_conversation(turns)})
        upstream.provider_factor = 2.2  # counts far more now: the next request overflows the corrected window
        await chat(proxy, {"model": "gpt-4", "messages": long_conversation(110)})
        learned = [e["self_correction"] for e in logs.events("request") if "self_correction" in e]
        assert len(learned) == 2 and learned[-1]["corrected_window"] == int(6000 / (learned[-1]["factor"] * 1.02))

    async def test_a_learned_correction_shows_in_the_log_and_metrics(self, proxy, upstream, logs):
        upstream.limit, upstream.provider_factor = 6000, 1.25
        await chat(proxy, {"model": "gpt-4", "messages": long_conversation()})
        await chat(proxy, {"model": "gpt-4", "messages": long_conversation(90)})
        second = logs.events("request")[-1]
        assert second["window_source"] == "correction" and second["applied_correction"]["provider"] == "openai"
        async with aiohttp.ClientSession() as session, session.get(proxy.make_url("/metrics")) as r:
            text = await r.text()
        assert 'context_guard_corrected_window_tokens{model="gpt-4",upstream="fake"}' in text


class TestAnOverflowWithoutNumbers:
    """OpenAI's Responses API refuses an over-window input without its count: the guard says its own."""

    @staticmethod
    def plan() -> Any:
        return fit({"model": "gpt-4o", "messages": [{"role": "user", "content": words(50)}]}, 8_000)

    def test_the_guards_count_is_said_after_the_providers_message(self):
        body = {
            "error": {
                "message": "Your input exceeds the context window of this model.",
                "code": "context_length_exceeded",
                "param": "input",
            }
        }
        plan = self.plan()
        told = overflow_told(json.dumps(body).encode(), Overflow("openai", None, None), plan)
        assert told is not None
        error = json.loads(told)["error"]
        assert error["message"].startswith(
            "Your input exceeds the context window of this model. (context-guard counted "
        )
        assert f"{plan.result.tokens_after:,} input tokens" in error["message"]
        assert (error["code"], error["param"]) == ("context_length_exceeded", "input")

    def test_an_overflow_with_the_providers_numbers_or_another_error_is_left_as_it_came(self):
        body = json.dumps({"error": {"message": "m"}}).encode()
        assert overflow_told(body, Overflow("openai", 8192, 9000), self.plan()) is None
        assert overflow_told(body, None, self.plan()) is None
        assert overflow_told(b"not json", Overflow("openai", None, None), self.plan()) is None
