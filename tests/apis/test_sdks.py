"""Every API shape driven by its official SDK, as a new user would drive it.

`TestSdkBodies` runs today: each SDK talks to the fake providers directly, and the body it really
sent (tool loops, streaming flags, Azure's deployment path) goes through its adapter: it parses,
counts, and when cut to a small window stays valid in that API's rules.

`TestThroughTheGuard` drives the same SDKs through the proxy in front of the fake providers: every
shape is counted, cut and forwarded valid, and the guard's own errors come back in its shape.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest
from aiohttp.test_utils import TestServer

from proxy.apis.registry import AdapterRegistry
from proxy.config.settings import settings_from_dict
from proxy.core.trimming.turns import split_conversation
from proxy.server.backends.models import Models
from proxy.server.process.app import create_app
from tests.apis.fitting import words
from tests.support.trimming import profile, tokenizer
from tests.support.upstream import FakeUpstream
from tests.support.validity import messages_problems, responses_problems

REGISTRY = AdapterRegistry()
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
}
CLAUDE_TOOL = {"name": "get_weather", "description": "Weather for a city", "input_schema": WEATHER_TOOL["parameters"]}
CLAUDE = "claude-sonnet-4-6"


@pytest.fixture
async def providers(aiohttp_server: Any) -> tuple[FakeUpstream, str]:
    fake = FakeUpstream(every_shape=True)
    server = await aiohttp_server(fake.app())
    return fake, str(server.make_url("")).rstrip("/")


def fit_received(fake: FakeUpstream, path_end: str, window: int, model: str = "gpt-4o") -> Any:
    """The last body the SDK sent to a path, through its adapter at `window`."""
    from proxy.apis.fitting import Counting, fit
    from proxy.core.plan import TrimPolicy

    received = fake.last(path_end)
    endpoint = REGISTRY.endpoint_for(received.path)
    assert endpoint is not None
    parsed = endpoint.parse(received.json())
    return fit(endpoint.adapter, parsed, Counting(profile(window, model), tokenizer(model)), TrimPolicy())


def history(turns: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for i in range(turns):
        items.append({"role": "user", "content": f"question {i} " + words(300)})
        items.append({"role": "assistant", "content": f"answer {i} " + words(300)})
    return items


class TestSdkBodies:
    async def test_a_responses_tool_loop_parses_with_the_call_and_its_output_as_one_unit(self, providers: Any) -> None:
        fake, url = providers
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)
        items: list[Any] = [*history(4), {"role": "user", "content": "Weather in Paris?"}]
        first = await client.responses.create(model="gpt-4o", input=items, tools=[WEATHER_TOOL])
        call = first.output[0]
        assert call.type == "function_call"
        items += [call, {"type": "function_call_output", "call_id": call.call_id, "output": "sunny " + words(200)}]
        second = await client.responses.create(model="gpt-4o", input=items, tools=[WEATHER_TOOL])
        assert second.output_text == fake.reply_text
        fitted = fit_received(fake, "/v1/responses", 1800)
        exchanges = [u for t in split_conversation(fitted.parsed.messages).turns for u in t.units if u.is_tool_exchange]
        protected = split_conversation(fitted.parsed.messages).protected
        assert not exchanges and len(protected) == 3  # the live exchange is protected, whole
        assert fitted.plan.result.outcome == "trimmed" and responses_problems(fitted.body) == []
        assert (
            fitted.body["input"][-2]["type"] == "function_call" and fitted.body["input"][-1]["call_id"] == call.call_id
        )

    async def test_a_streamed_response_is_relayed_event_by_event(self, providers: Any) -> None:
        fake, url = providers
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)
        stream = await client.responses.create(model="gpt-4o", input="Say hello", stream=True)
        kinds = [event.type async for event in stream]
        assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
        assert fit_received(fake, "/v1/responses", 128_000).parsed.stream

    async def test_an_azure_deployment_names_the_model_and_keeps_the_api_version(self, providers: Any) -> None:
        fake, url = providers
        client = openai.AsyncAzureOpenAI(
            azure_endpoint=url, api_key="azure-key", api_version="2024-10-21", max_retries=0
        )
        await client.chat.completions.create(model="prod-gpt4o", messages=[{"role": "user", "content": "hi"}])
        received = fake.last("/chat/completions")
        assert received.path == "/openai/deployments/prod-gpt4o/chat/completions"
        assert "api-version=2024-10-21" in received.query and received.headers["api-key"] == "azure-key"
        endpoint = REGISTRY.endpoint_for(received.path)
        assert endpoint is not None and endpoint.path_model == "prod-gpt4o"

    async def test_a_legacy_completion_prompt_is_counted_and_cut(self, providers: Any) -> None:
        fake, url = providers
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)
        completion = await client.completions.create(
            model="gpt-3.5-turbo-instruct", prompt="Once " + words(3000), max_tokens=50
        )
        assert completion.choices[0].text.strip() == fake.reply_text
        fitted = fit_received(fake, "/v1/completions", 2000, model="gpt-3.5-turbo-instruct")
        assert fitted.plan.result.fits and "tokens removed" in fitted.body["prompt"]

    async def test_an_anthropic_tool_loop_keeps_tool_use_and_tool_result_together(self, providers: Any) -> None:
        fake, url = providers
        client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-ant-test", max_retries=0)
        messages: list[Any] = [*history(4), {"role": "user", "content": "Weather in Paris?"}]
        first = await client.messages.create(model=CLAUDE, max_tokens=512, messages=messages, tools=[CLAUDE_TOOL])
        use = first.content[0]
        assert use.type == "tool_use"
        messages += [
            {"role": "assistant", "content": first.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny " + words(200)}],
            },
        ]
        second = await client.messages.create(model=CLAUDE, max_tokens=512, messages=messages, tools=[CLAUDE_TOOL])
        assert second.content[0].type == "text"
        fitted = fit_received(fake, "/v1/messages", 3000, model=CLAUDE)
        assert fitted.plan.result.outcome == "trimmed" and messages_problems(fitted.body) == []
        assert fitted.body["messages"][-1]["content"][0]["tool_use_id"] == use.id

    async def test_an_anthropic_stream_ends_with_the_whole_message(self, providers: Any) -> None:
        fake, url = providers
        client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-ant-test", max_retries=0)
        async with client.messages.stream(
            model=CLAUDE, max_tokens=64, messages=[{"role": "user", "content": "hi"}]
        ) as stream:
            message = await stream.get_final_message()
        assert message.content[0].text == fake.reply_text
        assert fit_received(fake, "/v1/messages", 200_000, model=CLAUDE).parsed.stream

    async def test_anthropic_count_tokens_bodies_parse_without_max_tokens(self, providers: Any) -> None:
        fake, url = providers
        client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-ant-test", max_retries=0)
        await client.messages.count_tokens(
            model=CLAUDE, messages=[{"role": "user", "content": "hi"}], tools=[CLAUDE_TOOL]
        )
        received = fake.last("/count_tokens")
        endpoint = REGISTRY.endpoint_for(received.path)
        assert endpoint is not None and endpoint.local and endpoint.parse(received.json()).fixed_tokens == 346


# -- Through the guard: waits on the handler wiring --------------------------------------------


async def _guard(aiohttp_server: Any, model_map: Any, upstream: str, **sections: Any) -> str:
    data: dict[str, Any] = {
        "upstreams": {"fake": {"base_url": upstream, "read_timeout": 5, "connect_timeout": 2}},
        **sections,
    }
    settings = settings_from_dict(data, "test.yaml", {})
    server: TestServer = await aiohttp_server(create_app(settings, Models(settings, model_map)))
    return str(server.make_url("")).rstrip("/")


SMALL = {"overrides": [{"match": "gpt-4o", "context_window": 2000}, {"match": CLAUDE, "context_window": 3000}]}


class TestThroughTheGuard:
    async def test_responses_over_budget_reach_the_provider_trimmed_and_valid(
        self, providers: Any, aiohttp_server: Any, model_map: Any
    ) -> None:
        fake, url = providers
        guard = await _guard(aiohttp_server, model_map, url + "/v1", models=SMALL)
        client = openai.AsyncOpenAI(base_url=guard + "/v1", api_key="sk-test", max_retries=0)
        raw = await client.responses.with_raw_response.create(
            model="gpt-4o", input=[*history(6), {"role": "user", "content": "latest"}], tools=[WEATHER_TOOL]
        )
        sent = fake.last("/v1/responses").json()
        assert int(raw.headers["x-context-guard-tokens-after"]) < int(raw.headers["x-context-guard-tokens-before"])
        assert len(sent["input"]) < 13 and sent["input"][-1]["content"] == "latest"
        assert responses_problems(sent) == [] and sent["tools"] == [WEATHER_TOOL]

    async def test_a_streamed_response_is_relayed_unchanged(
        self, providers: Any, aiohttp_server: Any, model_map: Any
    ) -> None:
        _, url = providers
        guard = await _guard(aiohttp_server, model_map, url + "/v1")
        client = openai.AsyncOpenAI(base_url=guard + "/v1", api_key="sk-test", max_retries=0)
        stream = await client.responses.create(model="gpt-4o", input="Say hello", stream=True)
        kinds = [event.type async for event in stream]
        assert kinds == [
            "response.created",
            "response.output_item.added",
            "response.output_text.delta",
            "response.output_item.done",
            "response.completed",
        ]

    async def test_a_body_that_fits_is_forwarded_byte_for_byte(
        self, providers: Any, aiohttp_server: Any, model_map: Any
    ) -> None:
        import aiohttp

        fake, url = providers
        guard = await _guard(aiohttp_server, model_map, url + "/v1")
        raw = json.dumps(
            {"model": "gpt-4o", "input": "hi", "x-unknown": {"nested": [1, 2.50, None]}}, indent=3
        ).encode()
        async with (
            aiohttp.ClientSession() as session,
            session.post(guard + "/v1/responses", data=raw, headers={"Content-Type": "application/json"}) as response,
        ):
            assert response.status == 200
        assert fake.last("/v1/responses").body == raw

    async def test_azure_deployments_are_counted_with_the_deployments_model(
        self, providers: Any, aiohttp_server: Any, model_map: Any
    ) -> None:
        fake, url = providers
        overrides = {"overrides": [{"match": "prod-gpt4o", "alias_of": "gpt-4o", "context_window": 2000}]}
        guard = await _guard(aiohttp_server, model_map, url, models=overrides)
        client = openai.AsyncAzureOpenAI(
            azure_endpoint=guard, api_key="azure-key", api_version="2024-10-21", max_retries=0
        )
        raw = await client.chat.completions.with_raw_response.create(
            model="prod-gpt4o", messages=[*history(6), {"role": "user", "content": "latest"}]
        )
        received = fake.last("/chat/completions")
        assert "api-version=2024-10-21" in received.query
        assert int(raw.headers["x-context-guard-tokens-after"]) <= int(raw.headers["x-context-guard-budget"])

    async def test_a_legacy_prompt_over_budget_is_cut_in_the_middle(
        self, providers: Any, aiohttp_server: Any, model_map: Any
    ) -> None:
        fake, url = providers
        guard = await _guard(
            aiohttp_server,
            model_map,
            url + "/v1",
            models={"overrides": [{"match": "gpt-3.5-turbo-instruct", "context_window": 2000}]},
        )
        client = openai.AsyncOpenAI(base_url=guard + "/v1", api_key="sk-test", max_retries=0)
        await client.completions.create(
            model="gpt-3.5-turbo-instruct", prompt="HEAD " + words(4000) + " TAIL", max_tokens=50
        )
        prompt = fake.last("/v1/completions").json()["prompt"]
        assert prompt.startswith("HEAD") and prompt.endswith("TAIL") and "tokens removed" in prompt

    async def test_anthropic_messages_over_budget_reach_the_provider_valid(
        self, providers: Any, aiohttp_server: Any, model_map: Any
    ) -> None:
        fake, url = providers
        guard = await _guard(aiohttp_server, model_map, url + "/v1", models=SMALL)
        client = anthropic.AsyncAnthropic(base_url=guard, api_key="sk-ant-test", max_retries=0)
        async with client.messages.stream(
            model=CLAUDE,
            max_tokens=256,
            messages=[*history(6), {"role": "user", "content": "latest"}],
            tools=[CLAUDE_TOOL],
        ) as stream:
            await stream.get_final_message()
        sent = fake.last("/v1/messages").json()
        assert messages_problems(sent) == [] and sent["messages"][-1]["content"] == "latest"
        assert len(sent["messages"]) < 13 and sent["tools"] == [CLAUDE_TOOL]

    async def test_anthropic_errors_raise_the_sdks_own_exceptions(
        self, providers: Any, aiohttp_server: Any, model_map: Any
    ) -> None:
        _, url = providers
        guard = await _guard(aiohttp_server, model_map, url + "/v1")
        client = anthropic.AsyncAnthropic(base_url=guard, api_key="sk-ant-test", max_retries=0)
        with pytest.raises(anthropic.BadRequestError) as error:
            await client.messages.create(model=CLAUDE, max_tokens=16, messages=[{"role": "system", "content": "x"}])  # type: ignore[list-item]
        assert error.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]

    async def test_count_tokens_is_answered_by_the_guard(
        self, providers: Any, aiohttp_server: Any, model_map: Any
    ) -> None:
        fake, url = providers
        guard = await _guard(aiohttp_server, model_map, url + "/v1")
        client = anthropic.AsyncAnthropic(base_url=guard, api_key="sk-ant-test", max_retries=0)
        counted = await client.messages.count_tokens(model=CLAUDE, messages=[{"role": "user", "content": "hi"}])
        assert counted.input_tokens > 0 and not [r for r in fake.received if r.path.endswith("/count_tokens")]

    @pytest.mark.parametrize(("model", "said"), [(CLAUDE, "upper-bound"), ("gpt-4o", "exact")])
    async def test_count_tokens_says_in_a_header_whether_its_count_is_exact_or_an_upper_bound(
        self, providers: Any, aiohttp_server: Any, model_map: Any, model: str, said: str
    ) -> None:
        """No tokenizer of Claude ships, so its count is a bound; gpt-4o's o200k vocabulary does."""
        _, url = providers
        guard = await _guard(aiohttp_server, model_map, url + "/v1")
        client = anthropic.AsyncAnthropic(base_url=guard, api_key="sk-ant-test", max_retries=0)
        raw = await client.messages.with_raw_response.count_tokens(
            model=model, messages=[{"role": "user", "content": "hi"}]
        )
        assert raw.headers["x-context-guard-count"] == said and (await raw.parse()).input_tokens > 0

    async def test_anthropics_overflow_error_tightens_the_window_and_the_request_is_retried(
        self, providers: Any, aiohttp_server: Any, model_map: Any
    ) -> None:
        fake, url = providers
        fake.limit = 2500
        guard = await _guard(aiohttp_server, model_map, url + "/v1")
        client = anthropic.AsyncAnthropic(base_url=guard, api_key="sk-ant-test", max_retries=0)
        message = await client.messages.create(
            model=CLAUDE, max_tokens=256, messages=[*history(12), {"role": "user", "content": "latest"}]
        )
        assert message.content[0].text == fake.reply_text and len(fake.received) == 2
