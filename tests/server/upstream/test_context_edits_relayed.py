"""Anthropic's context edits through the guard, driven by the official `anthropic` SDK: counted as
the provider applies them and forwarded as sent, cut or refused only past them; applied by the
guard for an upstream that cannot, with what they cleared in the answer, streamed or not."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest
from aiohttp.test_utils import TestServer

from proxy.config.settings import settings_from_dict
from tests.apis.fitting import words
from tests.server.conftest import Logs, Proxy
from tests.support.upstream import FakeUpstream
from tests.support.validity import messages_problems

CLAUDE = "claude-sonnet-4-6"
WINDOW = 16_000
BETA = "context-management-2025-06-27"
READ = {"name": "read", "description": "Read a file", "input_schema": {"type": "object"}}
CLAUDE_CODE = {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}  # sent on every request, 2.1.x


def clearing(keep: int) -> dict[str, Any]:
    return {
        "edits": [
            {
                "type": "clear_tool_uses_20250919",
                "trigger": {"type": "input_tokens", "value": 6000},
                "keep": {"type": "tool_uses", "value": keep},
            }
        ]
    }


def tool_loop(results: int = 24, words_each: int = 700) -> list[dict[str, Any]]:
    """24 tool calls answered with files: over the window by raw count, within it once all but three are cleared."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Survey the repository."}]
    for k in range(results):
        use = {"type": "tool_use", "id": f"toolu_{k}", "name": "read", "input": {"path": f"src/m{k}.py"}}
        messages.append({"role": "assistant", "content": [{"type": "text", "text": f"Reading {k}."}, use]})
        result = {"type": "tool_result", "tool_use_id": f"toolu_{k}", "content": f"file {k}: " + words(words_each)}
        messages.append({"role": "user", "content": [result]})
    return messages


@pytest.fixture
async def provider(aiohttp_server: Any) -> FakeUpstream:
    """A fake Anthropic that applies clear_tool_uses and refuses prompts over the window, by its own count."""
    return await FakeUpstream(every_shape=True, limit=WINDOW).served(aiohttp_server)


async def guarded(start_proxy: Proxy, fake: FakeUpstream, kind: str) -> anthropic.AsyncAnthropic:
    """The anthropic SDK through a guard whose one upstream is `fake`, of `kind`."""
    data = {
        "upstreams": {"fake": {"base_url": fake.url, "kind": kind, "read_timeout": 5, "connect_timeout": 2}},
        "models": {"overrides": [{"match": CLAUDE, "context_window": WINDOW}]},
    }
    server: TestServer = await start_proxy(settings_from_dict(data, "test.yaml", {}))
    return anthropic.AsyncAnthropic(base_url=str(server.make_url("")).rstrip("/"), api_key="sk-ant-test", max_retries=0)


async def create(
    client: anthropic.AsyncAnthropic, messages: list[Any], management: Any, stream: bool = False, **more: Any
) -> Any:
    fields: dict[str, Any] = {
        **more,
        "model": CLAUDE,
        "max_tokens": 1024,
        "messages": messages,
        "tools": [READ],
        "betas": ["interleaved-thinking-2025-05-14", BETA],
        "context_management": management,
    }
    if not stream:
        return await client.beta.messages.create(**fields)
    async with client.beta.messages.stream(**fields) as events:
        return await events.get_final_message()


class TestAnUpstreamThatEdits:
    @pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
    async def test_a_request_within_the_window_once_cleared_is_forwarded_as_sent(
        self, start_proxy: Proxy, provider: FakeUpstream, logs: Logs, stream: bool
    ) -> None:
        """Over the window by its raw count; the provider clears it, and its applied_edits reach the client."""
        provider.edits_context = True
        client = await guarded(start_proxy, provider, "anthropic")
        messages = tool_loop()
        answer = await create(client, messages, clearing(keep=3), stream)
        received = provider.last("/v1/messages")
        sent = received.json()
        assert sent["messages"] == messages and sent["context_management"] == clearing(keep=3)
        assert BETA in received.headers["anthropic-beta"]
        (applied,) = answer.context_management.applied_edits
        assert (applied.type, applied.cleared_tool_uses) == ("clear_tool_uses_20250919", 21)
        (event,) = logs.events("request")
        assert "context_edits:provider" in event["notes"] and event["outcome"] == "unchanged"

    async def test_claude_codes_request_arrives_as_sent(self, start_proxy: Proxy, provider: FakeUpstream) -> None:
        client = await guarded(start_proxy, provider, "anthropic")
        messages = tool_loop(3, 50)
        await create(client, messages, CLAUDE_CODE)
        received = provider.last("/v1/messages")
        assert received.json()["context_management"] == CLAUDE_CODE and received.json()["messages"] == messages
        assert received.headers["anthropic-beta"] == f"interleaved-thinking-2025-05-14,{BETA}"

    async def test_what_still_does_not_fit_once_cleared_is_cut_and_never_sent_over(
        self, start_proxy: Proxy, provider: FakeUpstream
    ) -> None:
        provider.edits_context = True
        client = await guarded(start_proxy, provider, "anthropic")
        messages = tool_loop()
        answer = await create(client, messages, clearing(keep=20))
        sent = provider.last("/v1/messages").json()
        assert answer.content and sent["messages"] != messages  # cut, and the provider's own count accepted it
        assert messages_problems(sent) == [] and sent["messages"][-1] == messages[-1]
        assert sent["context_management"] == clearing(keep=20)

    async def test_a_request_over_the_window_whatever_is_cleared_is_refused_in_anthropics_words(
        self, start_proxy: Proxy, provider: FakeUpstream
    ) -> None:
        provider.edits_context = True
        client = await guarded(start_proxy, provider, "anthropic")
        with pytest.raises(anthropic.BadRequestError) as refused:  # a system prompt is never cut
            await create(client, tool_loop(4, 50), clearing(keep=0), system=words(30_000, "alpha beta"))
        error = refused.value.body["error"]  # type: ignore[index]
        assert error["type"] == "invalid_request_error" and error["message"].startswith("prompt is too long:")
        assert not [r for r in provider.received if r.path.endswith("/messages")]

    async def test_count_tokens_answers_with_the_count_before_the_edits(
        self, start_proxy: Proxy, provider: FakeUpstream
    ) -> None:
        client = await guarded(start_proxy, provider, "anthropic")
        counted = await client.beta.messages.count_tokens(
            model=CLAUDE, messages=tool_loop(), tools=[READ], betas=[BETA], context_management=clearing(keep=3)
        )
        assert counted.context_management is not None
        assert counted.input_tokens < WINDOW < counted.context_management.original_input_tokens
        assert not [r for r in provider.received if r.path.endswith("/count_tokens")]


class TestAnUpstreamThatCannotEdit:
    @pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
    async def test_the_edits_arrive_applied_and_the_client_is_told_what_they_cleared(
        self, start_proxy: Proxy, provider: FakeUpstream, logs: Logs, stream: bool
    ) -> None:
        client = await guarded(start_proxy, provider, "generic")
        messages = tool_loop()
        answer = await create(client, messages, clearing(keep=3), stream)
        received = provider.last("/v1/messages")
        sent = received.json()
        assert "context_management" not in sent and received.headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"
        results = [m["content"][0]["content"] for m in sent["messages"][2::2]]
        assert results[21:] == [m["content"][0]["content"] for m in messages[44::2]]
        assert len(set(results[:21])) == 1 and results[0] != messages[2]["content"][0]["content"]
        (applied,) = answer.context_management.applied_edits
        assert applied.cleared_tool_uses == 21 and applied.cleared_input_tokens > 0
        assert "context_edits:guard" in logs.events("request")[0]["notes"]

    async def test_claude_codes_request_arrives_without_the_field_and_the_flag(
        self, start_proxy: Proxy, provider: FakeUpstream
    ) -> None:
        client = await guarded(start_proxy, provider, "generic")
        messages = [{"role": "user", "content": "Hello"}]
        answer = await create(client, messages, CLAUDE_CODE)
        received = provider.last("/v1/messages")
        assert "context_management" not in received.json() and received.json()["messages"] == messages
        assert BETA not in received.headers["anthropic-beta"] and answer.context_management is None
