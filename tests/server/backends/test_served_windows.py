"""The window a request is budgeted with is the one the provider serves it with: Anthropic's 1M
beta header read, and what an Anthropic upstream's overflow teaches named as Anthropic's and kept
when it is a smaller window, driven with the anthropic SDK against an in-process upstream that
counts with tiktoken directly (`FakeUpstream.provider_count`)."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from tests.server.conftest import Logs, Proxy, gateway_settings
from tests.support.cookbook import cookbook_count
from tests.support.upstream import FakeUpstream

ONE_M = "context-1m-2025-08-07"
SONNET_4_5 = "claude-sonnet-4-5"  # 200,000 tokens in the model map, 1,000,000 with the header
pytestmark = pytest.mark.filterwarnings("ignore:The model 'claude-sonnet-4-5' is deprecated:DeprecationWarning")


def history(turns: int, words: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for i in range(turns):
        messages.append({"role": "user", "content": f"question {i}: " + "lorem ipsum " * (words // 2)})
        messages.append({"role": "assistant", "content": f"answer {i}: " + "dolor sit " * (words // 2)})
    messages.append({"role": "user", "content": "And now?"})
    return messages


def plain_count(body: dict[str, Any]) -> int:
    """The body's tokens by the cookbook's rule, tiktoken directly: no code of the guard's."""
    system = body.get("system")
    return cookbook_count({"messages": body["messages"]}, [system] if isinstance(system, str) else [])


@pytest.fixture
async def anthropic_upstream(aiohttp_server: Any) -> FakeUpstream:
    return await FakeUpstream(every_shape=True, provider_factor=1.0).served(aiohttp_server)


async def guard_for(start_proxy: Proxy, upstream: FakeUpstream, **sections: Any) -> anthropic.AsyncAnthropic:
    upstreams = {"claude": {"base_url": upstream.url, "kind": "anthropic", "read_timeout": 20}}
    proxy = await start_proxy(gateway_settings(upstream.url, upstreams=upstreams, **sections))
    return anthropic.AsyncAnthropic(base_url=str(proxy.make_url("")), api_key="sk-ant-test", max_retries=0)


class TestTheOneMillionTokenHeader:
    async def test_a_300k_token_request_with_the_header_is_forwarded_uncut(
        self, start_proxy: Proxy, anthropic_upstream: FakeUpstream, logs: Logs
    ) -> None:
        client = await guard_for(start_proxy, anthropic_upstream)
        messages = history(150, 1000)
        await client.beta.messages.create(model=SONNET_4_5, max_tokens=1024, messages=messages, betas=[ONE_M])
        sent = anthropic_upstream.last("/v1/messages")
        assert sent.json()["messages"] == messages and plain_count(sent.json()) > 300_000
        assert ONE_M in sent.headers["anthropic-beta"]
        (line,) = logs.events("request")
        assert (line["context_window"], line["window_source"], line["outcome"]) == (1_000_000, "opt_in", "unchanged")

    async def test_without_it_the_same_request_is_cut_to_the_200k_budget(
        self, start_proxy: Proxy, anthropic_upstream: FakeUpstream, logs: Logs
    ) -> None:
        client = await guard_for(start_proxy, anthropic_upstream)
        messages = history(150, 1000)
        await client.messages.create(model=SONNET_4_5, max_tokens=1024, messages=messages)
        sent = anthropic_upstream.last("/v1/messages").json()
        assert len(sent["messages"]) < len(messages) and sent["messages"][-1] == messages[-1]
        assert plain_count(sent) <= 200_000 - 1024 - 10_000  # the window less max_tokens and the 5% margin
        (line,) = logs.events("request")
        assert (line["context_window"], line["window_source"], line["outcome"]) == (200_000, "model_map", "trimmed")

    async def test_a_model_whose_window_the_header_does_not_change_keeps_its_own(
        self, start_proxy: Proxy, anthropic_upstream: FakeUpstream, logs: Logs
    ) -> None:
        client = await guard_for(start_proxy, anthropic_upstream)
        messages = [{"role": "user", "content": "hi"}]
        await client.beta.messages.create(model="claude-haiku-4-5", max_tokens=64, messages=messages, betas=[ONE_M])
        (line,) = logs.events("request")
        assert (line["context_window"], line["window_source"]) == (200_000, "model_map")

    async def test_an_operators_window_wins_over_the_header(
        self, start_proxy: Proxy, anthropic_upstream: FakeUpstream, logs: Logs
    ) -> None:
        models = {"overrides": [{"match": SONNET_4_5, "context_window": 50_000}]}
        client = await guard_for(start_proxy, anthropic_upstream, models=models)
        await client.beta.messages.create(
            model=SONNET_4_5, max_tokens=64, messages=[{"role": "user", "content": "hi"}], betas=[ONE_M]
        )
        (line,) = logs.events("request")
        assert (line["context_window"], line["window_source"]) == (50_000, "config")


class TestWhatAnAnthropicOverflowTeaches:
    async def test_the_correction_names_anthropic(
        self, start_proxy: Proxy, anthropic_upstream: FakeUpstream, logs: Logs
    ) -> None:
        anthropic_upstream.limit = 6_000
        client = await guard_for(start_proxy, anthropic_upstream)
        await client.messages.create(model=SONNET_4_5, max_tokens=256, messages=history(40, 100))
        assert (
            len(anthropic_upstream.received) == 2
            and plain_count(anthropic_upstream.last("/v1/messages").json()) < 6_000
        )
        (line,) = logs.events("request")
        assert line["self_correction"]["provider"] == "anthropic" and line["self_correction"]["provider_limit"] == 6_000

    async def test_a_smaller_window_the_request_cannot_be_retried_in_is_kept(
        self, start_proxy: Proxy, anthropic_upstream: FakeUpstream, logs: Logs
    ) -> None:
        """Anthropic's max_tokens sentence from the provider: the smaller window it states cannot
        hold the system prompt with its max_tokens, so the guard refuses in the same words, and the
        next request is planned for the stated window."""
        anthropic_upstream.limit = 20_000
        client = await guard_for(start_proxy, anthropic_upstream)
        system = "rule " * 14_000  # never cut
        messages = [{"role": "user", "content": "hi"}]
        with pytest.raises(anthropic.BadRequestError, match="input length and `max_tokens` exceed context limit: "):
            await client.messages.create(model=SONNET_4_5, max_tokens=8_000, system=system, messages=messages)
        assert len(anthropic_upstream.received) == 1  # the refused retry never went out
        await client.messages.create(model=SONNET_4_5, max_tokens=2_000, system=system, messages=messages)
        first, second = logs.events("request")
        assert first["self_correction"]["provider"] == "anthropic" and first["outcome"] == "rejected"
        applied = second["applied_correction"]
        assert (applied["provider_limit"], applied["factor"], applied["corrected_window"]) == (20_000, 1.0, 19_607)
        assert second["context_window"] == 19_607 and second["window_source"] == "correction"
