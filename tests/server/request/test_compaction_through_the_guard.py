"""Compaction through the real app, the official SDKs as clients, against the suite's fake upstream:
an Anthropic compaction block and a Responses compaction item are where the count starts, and the
requests that compact (Codex's `compaction_trigger`, `/v1/responses/compact`) are counted and fitted
as compaction requests, never passed on uncounted nor refused at a small window.

What the provider receives is checked with the tests' own count (tiktoken directly), never the
guard's counter.
"""

from __future__ import annotations

import math
from typing import Any

import anthropic
import openai
import pytest

from tests.server.conftest import gateway_settings
from tests.support.cookbook import encoding
from tests.support.upstream import FakeUpstream
from tests.support.validity import responses_problems

CLAUDE = "claude-sonnet-4-5"
SYSTEM = "You are a coding agent."
SUMMARY = "Summary of the work so far: " + " ".join(["summary"] * 400)
ENCRYPTED = "gAAAAB" + "Q" * 2000
PROMPT = {"role": "user", "content": "Fix the failing test in the parser."}


@pytest.fixture
async def provider(aiohttp_server: Any) -> FakeUpstream:
    return await FakeUpstream(every_shape=True).served(aiohttp_server)


async def guard_url(start_proxy: Any, provider: FakeUpstream, window: int) -> str:
    models = {"overrides": [{"match": "*", "context_window": window}]}
    proxy = await start_proxy(gateway_settings(provider.url, models=models))
    return str(proxy.make_url("")).rstrip("/")


def words(n: int, word: str) -> str:
    return " ".join([word] * n)


def text_tokens(text: str) -> int:
    return len(encoding("gpt-4o").encode(text))


def anthropic_turns(first: int, count: int, size: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for k in range(first, first + count):
        out.append({"role": "user", "content": f"question {k}: " + words(size // 2, f"q{k}")})
        out.append(
            {"role": "assistant", "content": [{"type": "text", "text": f"answer {k}: " + words(size // 2, f"a{k}")}]}
        )
    return out


def with_block(newer: int, size: int) -> list[dict[str, Any]]:
    """40k tokens of old history, the compaction block (as Anthropic answered it), `newer` turns of
    `size` tokens, and the latest question."""
    block = {
        "role": "assistant",
        "content": [{"type": "compaction", "content": SUMMARY}, {"type": "text", "text": "Going on."}],
    }
    return [*anthropic_turns(0, 20, 2000), {"role": "user", "content": "Go on."}, block, *anthropic_turns(20, newer, size),
            {"role": "user", "content": "What is left to do?"}]  # fmt: skip


def read_from(messages: list[dict[str, Any]], start: int) -> int:
    """The system prompt and messages[start:] by tiktoken, 4 tokens of framing a message."""
    total = text_tokens(SYSTEM)
    for message in messages[start:]:
        content = message["content"]
        blocks = [{"text": content}] if isinstance(content, str) else content
        total += 4 + sum(text_tokens(b.get("text") or b.get("content") or "") for b in blocks)
    return total


def exchanges(steps: int, size: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [PROMPT]
    for k in range(steps):
        items.append({"type": "reasoning", "id": f"rs_{k}", "summary": [], "encrypted_content": "gAAAA" + "x" * 200})
        items.append({"type": "function_call", "call_id": f"c{k}", "name": "shell", "arguments": '{"cmd": "cat f"}'})
        items.append(
            {"type": "function_call_output", "call_id": f"c{k}", "output": f"out {k}: " + words(size, f"o{k}")}
        )
    return items


def items_count(body: dict[str, Any]) -> int:
    """What the model reads of a Responses body by tiktoken: instructions, item texts, calls, 4 a
    item, and a compaction item at one token a byte of its plaintext at most."""
    total = text_tokens(body.get("instructions") or "")
    for item in body["input"]:
        total += 4
        if item.get("type") == "compaction":
            total += math.ceil(len(item["encrypted_content"]) * 3 / 4)
        elif item.get("type") == "function_call":
            total += text_tokens(item["name"] + item["arguments"])
        elif item.get("type") == "function_call_output":
            total += text_tokens(item["output"])
        elif isinstance(item.get("content"), str):
            total += text_tokens(item["content"])
        elif isinstance(item.get("content"), list):
            total += sum(text_tokens(p.get("text", "")) for p in item["content"])
    return total


def with_material(body: dict[str, Any]) -> int:
    """How many tool outputs still hold the start of what the tool returned."""
    outputs = [i["output"] for i in body["input"] if i.get("type") == "function_call_output"]
    return sum(1 for k, text in enumerate(outputs) if text.startswith(f"out {k}: o{k} o{k}"))


class TestAnAnthropicCompactionBlock:
    async def test_the_history_before_it_is_not_counted_and_the_body_goes_unchanged(
        self, start_proxy: Any, provider: FakeUpstream
    ) -> None:
        client = anthropic.AsyncAnthropic(
            base_url=await guard_url(start_proxy, provider, 16_000), api_key="k", max_retries=0
        )
        messages = with_block(newer=2, size=2000)
        raw = await client.beta.messages.with_raw_response.create(
            model=CLAUDE,
            system=SYSTEM,
            messages=messages,
            max_tokens=1024,
            betas=["compact-2026-01-12"],  # type: ignore[arg-type]
        )
        assert provider.received[-1].json()["messages"] == messages
        after = read_from(messages, 41)
        assert (
            after <= int(raw.headers["x-context-guard-tokens-before"]) <= 1.5 * after < 16_000 < read_from(messages, 0)
        )

    async def test_over_the_window_after_it_the_history_goes_first_and_the_block_and_latest_turn_stay(
        self, start_proxy: Any, provider: FakeUpstream
    ) -> None:
        client = anthropic.AsyncAnthropic(
            base_url=await guard_url(start_proxy, provider, 16_000), api_key="k", max_retries=0
        )
        messages = with_block(newer=10, size=2000)
        raw = await client.beta.messages.with_raw_response.create(
            model="deepseek-chat",
            system=SYSTEM,
            messages=messages,
            max_tokens=1024,
            betas=["compact-2026-01-12"],  # type: ignore[arg-type]
        )
        sent = provider.received[-1].json()["messages"]
        assert sent[0] == messages[41] and sent[-1] == messages[-1]
        assert read_from(sent, 0) <= int(raw.headers["x-context-guard-budget"])


class TestAResponsesCompactionItem:
    async def test_items_before_it_go_before_any_after_it(self, start_proxy: Any, provider: FakeUpstream) -> None:
        client = openai.AsyncOpenAI(
            base_url=await guard_url(start_proxy, provider, 16_000) + "/v1", api_key="k", max_retries=0
        )
        old = [{"role": "user", "content": f"question {k}: " + words(1000, f"q{k}")} for k in range(20)]
        newer = [{"role": "user", "content": f"note {k}: " + words(1000, f"n{k}")} for k in range(8)]
        item = {"type": "compaction", "id": "cmp_1", "encrypted_content": ENCRYPTED}
        raw = await client.responses.with_raw_response.create(
            model="gpt-4o",
            instructions=SYSTEM,
            input=[*old, item, *newer],
            max_output_tokens=1024,  # type: ignore[list-item]
        )
        sent = provider.received[-1].json()
        assert sent["input"][0] == item and sent["input"][-1] == newer[-1]
        assert items_count(sent) <= int(raw.headers["x-context-guard-budget"])


class TestRequestsThatCompact:
    async def test_codex_s_compaction_trigger_is_fitted_evenly(self, start_proxy: Any, provider: FakeUpstream) -> None:
        client = openai.AsyncOpenAI(
            base_url=await guard_url(start_proxy, provider, 32_000) + "/v1", api_key="k", max_retries=0
        )
        items = [*exchanges(24, 1500), {"type": "compaction_trigger"}]
        raw = await client.responses.with_raw_response.create(model="gpt-4o", instructions=SYSTEM, input=items)  # type: ignore[arg-type]
        sent = provider.received[-1].json()
        assert int(raw.headers["x-context-guard-tokens-before"]) > 32_000
        assert items_count(sent) <= int(raw.headers["x-context-guard-budget"])
        assert sent["input"][0] == PROMPT and sent["input"][-1] == {"type": "compaction_trigger"}
        assert with_material(sent) >= 16 and responses_problems(sent) == []

    async def test_a_standalone_compaction_is_counted_and_fitted_not_passed_through(
        self, start_proxy: Any, provider: FakeUpstream
    ) -> None:
        client = openai.AsyncOpenAI(
            base_url=await guard_url(start_proxy, provider, 32_000) + "/v1", api_key="k", max_retries=0
        )
        raw = await client.responses.with_raw_response.compact(
            model="gpt-4o", instructions=SYSTEM, input=exchanges(24, 1500)
        )  # type: ignore[arg-type]
        received = provider.received[-1]
        sent = received.json()
        assert received.path == "/v1/responses/compact"
        assert int(raw.headers["x-context-guard-tokens-before"]) > 32_000
        assert items_count(sent) <= int(raw.headers["x-context-guard-budget"])
        assert sent["input"][0] == PROMPT and with_material(sent) >= 16 and responses_problems(sent) == []


class TestASmallWindow:
    async def test_codex_at_16k_is_answered_where_it_was_refused(
        self, start_proxy: Any, provider: FakeUpstream
    ) -> None:
        """7.6k tokens of instructions, encrypted reasoning and three ~3k-token results at a 16k
        window: once refused (13,670 > 13,107), now the oldest result is cleared."""
        client = openai.AsyncOpenAI(
            base_url=await guard_url(start_proxy, provider, 16_384) + "/v1", api_key="k", max_retries=0
        )
        raw = await client.responses.with_raw_response.create(
            model="gpt-4o",
            instructions=words(7600, "rule"),
            input=exchanges(3, 1500),  # type: ignore[arg-type]
        )
        sent = provider.received[-1].json()
        assert items_count(sent) <= int(raw.headers["x-context-guard-budget"])
        outputs = [i["output"] for i in sent["input"] if i.get("type") == "function_call_output"]
        assert outputs[0].startswith("[context-guard cleared") and outputs[2].startswith("out 2: o2")
