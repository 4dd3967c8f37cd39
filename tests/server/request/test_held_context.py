"""Context the provider holds, counted: Responses chains by `previous_response_id` and by
`conversation`, driven by the official openai SDK through the real app against a fake that keeps
state as OpenAI does (`tests.support.stored_responses`: every earlier input and output of the chain
is in the prompt again, counted by the fake's own rule, never the guard's).

The guard's count of each call (`x-context-guard-tokens-before`) is held against the fake's count
of the same call: at most 2% under it, at most 30% over. The call that makes a chain exceed the
window is refused by the guard with the numbers, never sent over the window, or forwarded when the
client asked the provider to truncate.
"""

from __future__ import annotations

import base64
import os
from typing import Any

import aiohttp
import openai
import pytest

from proxy.config.settings import settings_from_dict
from proxy.server.backends.models import Models
from proxy.server.process.app import create_app
from proxy.server.request.gateway import GATEWAY
from proxy.state import MemoryStore
from tests.support.upstream import FakeUpstream

MODEL = "gpt-4o"
RESERVE = 200


def paragraph(turn: int, words: int = 600) -> str:
    """A user turn of about `words` tokens, different on every turn."""
    return f"Turn {turn}. " + " ".join(f"fact{turn}x{i}" if i % 7 == 0 else "river" for i in range(words))


def settings(provider: FakeUpstream, window: int | None = None) -> Any:
    upstream = {"base_url": provider.url, "kind": "openai", "read_timeout": 10, "connect_timeout": 2}
    data: dict[str, Any] = {"upstreams": {"openai": upstream}}
    if window is not None:
        data["models"] = {"overrides": [{"match": MODEL, "context_window": window}]}
    return settings_from_dict(data, "test.yaml", {})


@pytest.fixture
async def provider(aiohttp_server: Any) -> FakeUpstream:
    return await FakeUpstream(every_shape=True).served(aiohttp_server)


async def guard(aiohttp_server: Any, model_map: Any, provider: FakeUpstream, **options: Any) -> Any:
    """The guard in front of `provider`; with `store`, its learned state is that store."""
    chosen = settings(provider, options.get("window"))
    app = create_app(chosen, Models(chosen, model_map))
    if options.get("store") is not None:
        app[GATEWAY].store = options["store"]
    server = await aiohttp_server(app)
    return str(server.make_url("/v1"))


def client(url: str, key: str = "sk-client-a") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url, api_key=key, max_retries=0)


def within_band(guard_count: int, provider_count: int) -> bool:
    """At most 2% under the provider's count, at most 30% over it."""
    return provider_count * 0.98 <= guard_count <= provider_count * 1.30


async def chain(sdk: openai.AsyncOpenAI, calls: int, **first: Any) -> list[tuple[int, dict[str, str]]]:
    """`calls` turns chained by previous_response_id (after `first`'s fields on the first call):
    the guard's count and headers of each."""
    seen, previous = [], None
    for turn in range(calls):
        fields: dict[str, Any] = {"previous_response_id": previous} if previous else dict(first)
        raw = await sdk.responses.with_raw_response.create(
            model=MODEL, input=paragraph(turn), max_output_tokens=RESERVE, **fields
        )
        previous = raw.parse().id
        seen.append((int(raw.headers["x-context-guard-tokens-before"]), dict(raw.headers)))
    return seen


class TestAResponsesChain:
    async def test_each_call_of_a_chain_of_six_is_counted_with_what_the_provider_holds(
        self, aiohttp_server, model_map, provider
    ):
        """Every call after the first is counted from the ledger: the stored response's input +
        output, as the provider's answer said it, plus what the call sends."""
        sdk = client(await guard(aiohttp_server, model_map, provider))
        seen = await chain(sdk, 6)
        for (counted, _), provider_count in zip(seen, provider.stored.counted, strict=True):
            assert within_band(counted, provider_count), (counted, provider_count)
        assert [headers.get("x-context-guard-held") for _, headers in seen] == [None] + ["ledger"] * 5
        # The first call is counted by gpt-4o's own tokenizer; the others carry the provider's reports.
        assert [headers["x-context-guard-count"] for _, headers in seen] == ["exact"] + ["estimate"] * 5
        assert provider.stored.counted[-1] > 5 * provider.stored.counted[0]  # the chain is what weighs

    async def test_a_streamed_chain_is_counted_from_its_completed_events(self, aiohttp_server, model_map, provider):
        sdk = client(await guard(aiohttp_server, model_map, provider))
        previous = None
        for turn in range(3):
            fields = {"previous_response_id": previous} if previous else {}
            async with sdk.responses.with_streaming_response.create(
                model=MODEL, input=paragraph(turn), max_output_tokens=RESERVE, stream=True, **fields
            ) as raw:
                counted = int(raw.headers["x-context-guard-tokens-before"])
                async for event in await raw.parse():
                    if event.type == "response.completed":
                        previous = event.response.id
        assert within_band(counted, provider.stored.counted[-1])

    async def test_a_chain_the_ledger_does_not_know_is_counted_by_the_provider(
        self, aiohttp_server, model_map, provider
    ):
        """A replica that relayed none of the chain asks `/responses/input_tokens` with the same fields."""
        first = client(await guard(aiohttp_server, model_map, provider))
        seen = await chain(first, 3)
        other = client(await guard(aiohttp_server, model_map, provider))  # its own memory: nothing learned
        previous = f"resp_{len(provider.stored.responses)}"
        raw = await other.responses.with_raw_response.create(
            model=MODEL, input=paragraph(9), max_output_tokens=RESERVE, previous_response_id=previous
        )
        assert raw.headers["x-context-guard-held"] == "provider"
        assert raw.headers["x-context-guard-count"] == "exact"  # the provider's count of the whole, and its own
        assert within_band(int(raw.headers["x-context-guard-tokens-before"]), provider.stored.counted[-1])
        assert any(r.path.endswith("/responses/input_tokens") for r in provider.received)
        assert seen

    async def test_two_replicas_sharing_a_store_share_the_ledger(self, aiohttp_server, model_map, provider):
        shared = MemoryStore()
        one = client(await guard(aiohttp_server, model_map, provider, store=shared))
        two = client(await guard(aiohttp_server, model_map, provider, store=shared))
        answer = await one.responses.create(model=MODEL, input=paragraph(0), max_output_tokens=RESERVE)
        raw = await two.responses.with_raw_response.create(
            model=MODEL, input=paragraph(1), max_output_tokens=RESERVE, previous_response_id=answer.id
        )
        assert raw.headers["x-context-guard-held"] == "ledger"
        assert within_band(int(raw.headers["x-context-guard-tokens-before"]), provider.stored.counted[-1])
        assert not any(r.path.endswith("/responses/input_tokens") for r in provider.received)


class TestAConversation:
    async def test_each_call_of_a_conversation_is_counted_with_its_latest_total(
        self, aiohttp_server, model_map, provider
    ):
        sdk = client(await guard(aiohttp_server, model_map, provider))
        conversation = await sdk.conversations.create()
        counts = []
        for turn in range(6):
            raw = await sdk.responses.with_raw_response.create(
                model=MODEL, input=paragraph(turn), max_output_tokens=RESERVE, conversation=conversation.id
            )
            counts.append(int(raw.headers["x-context-guard-tokens-before"]))
        for counted, provider_count in zip(counts, provider.stored.counted, strict=True):
            assert within_band(counted, provider_count), (counted, provider_count)
        assert provider.stored.counted[-1] > 5 * provider.stored.counted[0]


class TestAChainOverTheWindow:
    WINDOW = 5000

    async def test_the_call_that_would_exceed_the_window_is_refused_with_the_numbers(
        self, aiohttp_server, model_map, provider
    ):
        provider.stored.limit = self.WINDOW
        sdk = client(await guard(aiohttp_server, model_map, provider, window=self.WINDOW))
        previous, refused = None, None
        for turn in range(12):
            fields = {"previous_response_id": previous} if previous else {}
            try:
                previous = (
                    await sdk.responses.create(model=MODEL, input=paragraph(turn), max_output_tokens=RESERVE, **fields)
                ).id
            except openai.BadRequestError as error:
                refused = error
                break
        assert refused is not None, "the chain outgrew the window without a refusal"
        assert refused.code == "context_length_exceeded"
        budget = int(refused.response.headers["x-context-guard-budget"])
        counted = int(refused.response.headers["x-context-guard-tokens-before"])
        assert counted > budget and f"{counted:,}" in refused.message and str(self.WINDOW) in refused.message
        assert "held by the provider" in refused.message
        assert all(count <= self.WINDOW for count in provider.stored.counted)  # nothing sent over the window
        assert len(provider.received) == len(provider.stored.counted)  # the refused call never reached it

    async def test_with_truncation_auto_the_call_goes_to_the_provider_noted(
        self, aiohttp_server, model_map, provider, logs
    ):
        provider.stored.limit = self.WINDOW
        sdk = client(await guard(aiohttp_server, model_map, provider, window=self.WINDOW))
        previous = None
        for turn in range(12):
            fields = {"previous_response_id": previous} if previous else {}
            answer = await sdk.responses.create(
                model=MODEL, input=paragraph(turn), max_output_tokens=RESERVE, truncation="auto", **fields
            )
            previous = answer.id
        lines = await logs.written("request", 12)
        assert lines[-1]["outcome"] == "forwarded_provider_truncates"
        assert "provider_truncates" in lines[-1]["notes"]

    async def test_an_overflow_the_provider_answers_without_numbers_is_recorded_and_told(
        self, aiohttp_server, model_map, provider, logs
    ):
        """A provider whose window is smaller than the one the guard knows refuses the chain with a
        400 without numbers: the log says it was an overflow, and the client is told the guard's
        own count."""
        provider.stored.limit = self.WINDOW
        sdk = client(await guard(aiohttp_server, model_map, provider))  # the model map's window: far larger
        previous = None
        with pytest.raises(openai.BadRequestError) as refused:
            for turn in range(12):
                fields = {"previous_response_id": previous} if previous else {}
                previous = (
                    await sdk.responses.create(model=MODEL, input=paragraph(turn), max_output_tokens=RESERVE, **fields)
                ).id
        assert refused.value.code == "context_length_exceeded"
        assert "context-guard counted" in refused.value.message
        line = (await logs.written("request", len(provider.received)))[-1]
        assert line["upstream_overflow"] == {"provider": "openai"}
        async with aiohttp.ClientSession() as session:
            async with session.get(str(sdk.base_url).replace("/v1/", "/metrics")) as response:
                metrics = await response.text()
        assert 'context_guard_upstream_overflows_total{model="gpt-4o",numbers="no"} 1.0' in metrics
        assert 'context_guard_provider_prompt_tokens_total{model="gpt-4o"}' in metrics


class TestEncryptedReasoning:
    async def test_is_counted_by_what_its_ciphertext_can_decode_to_and_flagged(
        self, aiohttp_server, model_map, provider
    ):
        """Codex sends its reasoning back as `encrypted_content`: 8,000 base64 characters decode to at
        most 6,000 bytes, so at most 6,000 tokens; the count says it is not exact."""
        sdk = client(await guard(aiohttp_server, model_map, provider))
        cipher = base64.b64encode(os.urandom(6_000)).decode()
        items = [
            {"role": "user", "content": "Plan the migration."},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": cipher},
            {"role": "assistant", "content": "First, the schema."},
            {"role": "user", "content": "And then?"},
        ]
        raw = await sdk.responses.with_raw_response.create(
            model=MODEL, input=items, store=False, include=["reasoning.encrypted_content"], max_output_tokens=RESERVE
        )
        assert int(raw.headers["x-context-guard-tokens-before"]) >= 6_000
        assert raw.headers["x-context-guard-count"] == "upper-bound"
