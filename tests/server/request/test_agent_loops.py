"""An agent's tool loop through the guard: one prompt and 30 tool steps of real file content at a
16k window, sent by the official SDKs in the chat, Responses and Anthropic shapes, and a Claude
Code-like compaction request.

What the fake provider receives is checked with counts of the tests' own (the cookbook rule with
tiktoken directly, never the guard's counter): it fits the budget, every call keeps its result,
the opening prompt and the newest three results arrive verbatim; the guard's own count says how
much of the window was used; and consecutive requests share most of their tokens as a prefix,
which is what a provider's prompt cache bills at a fraction.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import anthropic
import openai
import pytest

from tests.server.conftest import gateway_settings
from tests.support.agent_sessions import (
    ANTHROPIC_TOOL,
    CHAT_TOOL,
    PROMPT,
    RESPONSES_TOOL,
    SYSTEM,
    Step,
    agent_steps,
    anthropic_messages,
    chat_messages,
    responses_input,
)
from tests.support.cookbook import TOOLS_JSON_MARGIN, cookbook_count, encoding
from tests.support.upstream import FakeUpstream
from tests.support.validity import messages_problems, responses_problems

WINDOW = 16_384
STEPS = 30
CLAUDE = "claude-sonnet-4-6"
CODEX_COMPACT = (
    "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary for another LLM that will "
    "resume the task.\n\nInclude:\n- Current progress and key decisions made\n- What remains to be done"
)
# An Anthropic-compatible endpoint whose vocabulary the guard has (DeepSeek's /anthropic API): its count
# is exact, as gpt-4o's is. Claude's own vocabulary does not ship, and its bound counts about a third
# more, so a 16k window holds about 12k of Claude's content: clearings come closer together there.
COMPATIBLE = "deepseek-chat"
CLAUDE_CODE_COMPACT = (
    "Your task is to create a detailed summary of the conversation so far, paying close attention to the "
    "user's explicit requests and your previous actions.\nThis summary should be thorough in capturing "
    "technical details, code patterns, and architectural decisions that would be essential for continuing "
    "development work without losing context."
)


@pytest.fixture
async def provider(aiohttp_server: Any) -> FakeUpstream:
    return await FakeUpstream(every_shape=True).served(aiohttp_server)


@pytest.fixture
def steps() -> list[Step]:
    return agent_steps(STEPS, seed=36)


async def guard_url(start_proxy: Any, provider: FakeUpstream, window: int = WINDOW) -> str:
    models = {"overrides": [{"match": "*", "context_window": window}]}
    proxy = await start_proxy(gateway_settings(provider.url, models=models))
    return str(proxy.make_url("")).rstrip("/")


# -- what the provider received, read in each shape, by the tests' own rules ---------------------


def chat_view(shape: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """`body` as chat completions, for the cookbook count: calls as `tool_calls`, results as tool
    messages, the system prompt as a system message."""
    if shape == "chat":
        return dict(body)
    messages: list[dict[str, Any]] = [{"role": "system", "content": body.get("instructions") or body.get("system")}]
    if shape == "responses":
        for item in body["input"]:
            if item.get("type") == "function_call":
                call = {
                    "id": item["call_id"],
                    "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]},
                }
                messages.append({"role": "assistant", "tool_calls": [call]})
            elif item.get("type") == "function_call_output":
                messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
            else:
                messages.append({"role": item["role"], "content": item["content"]})
    else:
        for message in body["messages"]:
            for block in message["content"] if isinstance(message["content"], list) else [message["content"]]:
                if isinstance(block, str) or block["type"] == "text":
                    text = block if isinstance(block, str) else block["text"]
                    messages.append({"role": message["role"], "content": text})
                elif block["type"] == "tool_use":
                    call = {
                        "id": block["id"],
                        "function": {"name": block["name"], "arguments": json.dumps(block["input"])},
                    }
                    messages.append({"role": "assistant", "tool_calls": [call]})
                elif block["type"] == "tool_result":
                    messages.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": block["content"]})
                else:  # thinking: the model reads it
                    messages.append({"role": "assistant", "content": json.dumps(block)})
    return {"model": body["model"], "messages": messages, "tools": [CHAT_TOOL]}


def independent_count(view: Mapping[str, Any]) -> int:
    """The prompt tokens of a chat view with tiktoken directly: the cookbook's rule for messages
    (3 a message, its content, 3 for the reply) and tools (their JSON, less the margin it counts
    over OpenAI's rendering), and a tool call as OpenAI renders one (tests/core/costs/test_tools_api_counts.py):
    its name and arguments and 8 of framing, a result its call's name and 1 beside its content."""
    enc = encoding("gpt-4o")
    names = {c["id"]: c["function"]["name"] for m in view["messages"] for c in m.get("tool_calls") or ()}
    tools = cookbook_count({"model": view["model"], "messages": [], "tools": view["tools"]}) - TOOLS_JSON_MARGIN
    tokens = tools
    for message in view["messages"]:
        content = message.get("content")
        tokens += 3 + (len(enc.encode(content)) if isinstance(content, str) else 0)
        for call in message.get("tool_calls") or ():
            tokens += 8 + len(enc.encode(call["function"]["name"])) + len(enc.encode(call["function"]["arguments"]))
        if message["role"] == "tool":
            tokens += 1 + len(enc.encode(names.get(message["tool_call_id"], "")))
    return tokens


def results(view: Mapping[str, Any]) -> list[str]:
    return [m["content"] for m in view["messages"] if m["role"] == "tool"]


def pair_problems(view: Mapping[str, Any]) -> list[str]:
    """Calls without their result right after them, results without their call before."""
    problems, open_calls = [], set()
    for message in view["messages"]:
        if message["role"] == "tool":
            if message["tool_call_id"] not in open_calls:
                problems.append(f"result {message['tool_call_id']} has no call")
            open_calls.discard(message["tool_call_id"])
        else:
            if open_calls:
                problems.append(f"calls {sorted(open_calls)} have no result")
            open_calls = {c["id"] for c in message.get("tool_calls") or ()}
    return problems + ([f"calls {sorted(open_calls)} have no result"] if open_calls else [])


def shared_prefix(before: Mapping[str, Any], after: Mapping[str, Any]) -> float:
    """The share of `after`'s tokens (its JSON, written the same way every time) that are the
    start of `before`'s."""
    enc = encoding("gpt-4o")
    a, b = (enc.encode(json.dumps(body, ensure_ascii=False, sort_keys=True)) for body in (before, after))
    same = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return same / len(b)


# -- the three SDKs, one request each -------------------------------------------------------------

Send = Callable[[list[Step]], Any]


def chat_sender(url: str) -> Send:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)

    async def send(steps: list[Step]) -> Any:
        return await client.chat.completions.with_raw_response.create(
            model="gpt-4o",
            messages=chat_messages(steps),
            tools=[CHAT_TOOL],
            max_tokens=1024,
        )

    return send


def responses_sender(url: str) -> Send:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)

    async def send(steps: list[Step]) -> Any:
        return await client.responses.with_raw_response.create(
            model="gpt-4o",
            instructions=SYSTEM,
            input=responses_input(steps),
            tools=[RESPONSES_TOOL],
            max_output_tokens=1024,
        )

    return send


def anthropic_sender(url: str, model: str = COMPATIBLE) -> Send:
    client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-ant-test", max_retries=0)

    async def send(steps: list[Step]) -> Any:
        return await client.messages.with_raw_response.create(
            model=model,
            system=SYSTEM,
            messages=anthropic_messages(steps, thinking=True),
            tools=[ANTHROPIC_TOOL],
            max_tokens=1024,
        )

    return send


SHAPES = {
    "chat": chat_sender,
    "responses": responses_sender,
    "messages": anthropic_sender,
    "messages-claude": lambda url: anthropic_sender(url, CLAUDE),
}


class TestAnAgentLoopAtA16kWindow:
    @pytest.mark.parametrize("shape", list(SHAPES))
    async def test_every_step_is_answered_within_budget_with_the_prompt_and_the_newest_results_whole(
        self, shape: str, start_proxy: Any, provider: FakeUpstream, steps: list[Step]
    ) -> None:
        """30 steps of 0.4-4k tokens each (about 60k in all) through a 16k window: never refused;
        what the provider gets fits by an independent count, keeps every call with its result,
        the opening prompt and the newest three results verbatim, uses at least 60% of the window,
        and shares at least 70% of its tokens as a prefix with the request before it."""
        send = SHAPES[shape](await guard_url(start_proxy, provider))
        sent: list[dict[str, Any]] = []
        used: list[float] = []
        reuse: list[float] = []
        for k in range(1, STEPS + 1):
            raw = await send(steps[:k])  # a refusal raises
            body = provider.received[-1].json()
            view = chat_view({"chat": "chat", "responses": "responses"}.get(shape, "anthropic"), body)
            budget = int(raw.headers["x-context-guard-budget"])
            assert independent_count(view) <= budget, f"step {k}"
            assert pair_problems(view) == [], f"step {k}"
            if shape != "chat":
                assert (responses_problems if shape == "responses" else messages_problems)(body) == []
            assert next(m for m in view["messages"] if m["role"] == "user")["content"] == PROMPT
            assert results(view)[-3:] == [s.result for s in steps[max(0, k - 3) : k]], f"step {k}"
            if shape.startswith("messages"):  # the newest exchanges whole: each thinking block with its tool_use
                assert body["messages"][-6:] == anthropic_messages(steps[:k], thinking=True)[-6:]
            if int(raw.headers["x-context-guard-removed"]):  # trimmed: from here on, every step is
                used.append(int(raw.headers["x-context-guard-tokens-after"]) / WINDOW)
                reuse.append(shared_prefix(sent[-1], body))
            sent.append(body)
        assert len(used) >= 15  # trimming started early and went on to the end
        assert sum(used) / len(used) >= 0.6
        # Claude's bound counts this content about 1.25x, so the newest three results, never cleared, fill
        # more of the budget: every clearing there already clears every older result (the step never
        # binds), at the latest request it can, so no block size spaces them further; six clearings in
        # 24 trimmed steps against four at an exact count (see COMPATIBLE): 0.69 measured there.
        assert sum(reuse) / len(reuse) >= (0.65 if shape == "messages-claude" else 0.7)

    async def test_a_cleared_result_reads_the_same_on_every_later_request(
        self, start_proxy: Any, provider: FakeUpstream, steps: list[Step]
    ) -> None:
        """The placeholder says what was removed and how to get it back, and its bytes never
        change once a result is cleared, so the provider's cache keeps the prefix it is in."""
        send = chat_sender(await guard_url(start_proxy, provider))
        seen: dict[str, str] = {}
        for k in range(1, STEPS + 1):
            raw = await send(steps[:k])
            for message in provider.received[-1].json()["messages"]:
                if (
                    message["role"] == "tool"
                    and message["content"] != steps[int(message["tool_call_id"].rsplit("_", 1)[1])].result
                ):
                    assert seen.setdefault(message["tool_call_id"], message["content"]) == message["content"]
                    assert "read_file" in message["content"] and "calling the tool again" in message["content"]
        assert len(seen) >= 10
        assert (
            int(raw.headers["x-context-guard-cleared"]) >= 10 and int(raw.headers["x-context-guard-prefix-tokens"]) > 0
        )

    async def test_the_log_line_says_what_was_cleared_and_the_prefix_kept(
        self, start_proxy: Any, provider: FakeUpstream, steps: list[Step], logs: Any
    ) -> None:
        send = chat_sender(await guard_url(start_proxy, provider))
        raw = await send(steps)
        event = logs.events("request")[-1]
        assert event["cleared"]["count"] == int(raw.headers["x-context-guard-cleared"]) > 0
        assert event["cleared"]["tokens"] == int(raw.headers["x-context-guard-cleared-tokens"]) > 0
        assert 0 < event["prefix_tokens"] == int(raw.headers["x-context-guard-prefix-tokens"]) < event["tokens_after"]
        assert "cleared" in {r["kind"] for r in event["removed"]}


class TestAClientsCompactionRequest:
    async def test_a_claude_code_compaction_keeps_its_opening_and_material_from_most_exchanges(
        self, start_proxy: Any, provider: FakeUpstream
    ) -> None:
        """40 exchanges (about 80k tokens) and Claude Code's summary prompt, at a 32k window: the
        guard shortens the tool results instead of dropping the history, so the summary has the
        task and something of every file to work from."""
        window = 32_768
        steps = agent_steps(40, seed=7)
        url = await guard_url(start_proxy, provider, window)
        client = anthropic.AsyncAnthropic(base_url=url, api_key="sk-ant-test", max_retries=0)
        messages = [
            *anthropic_messages(steps),
            {"role": "assistant", "content": [{"type": "text", "text": "I have read every file."}]},
            {"role": "user", "content": [{"type": "text", "text": CLAUDE_CODE_COMPACT}]},
        ]
        raw = await client.messages.with_raw_response.create(
            model=CLAUDE,
            system=SYSTEM,
            messages=messages,
            tools=[ANTHROPIC_TOOL],
            max_tokens=4096,
        )
        body = provider.received[-1].json()
        assert body["messages"][0] == messages[0] and body["messages"][-1] == messages[-1]
        assert messages_problems(body) == []
        assert int(raw.headers["x-context-guard-tokens-after"]) >= 0.6 * window
        kept = results(chat_view("anthropic", body))
        with_material = [
            text for text, step in zip(kept, steps, strict=True) if step.result[:200] in text or step.result == text
        ]
        assert len(with_material) >= len(steps) / 2

    async def test_a_codex_compaction_in_the_responses_shape_keeps_its_history_too(
        self, start_proxy: Any, provider: FakeUpstream
    ) -> None:
        window = 32_768
        steps = agent_steps(40, seed=8)
        url = await guard_url(start_proxy, provider, window)
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)
        items = [*responses_input(steps), {"role": "user", "content": CODEX_COMPACT}]
        raw = await client.responses.with_raw_response.create(
            model="gpt-4o", instructions=SYSTEM, input=items, tools=[RESPONSES_TOOL], max_output_tokens=4096
        )
        body = provider.received[-1].json()
        assert body["input"][0] == items[0] and body["input"][-1] == items[-1]
        assert responses_problems(body) == []
        assert int(raw.headers["x-context-guard-tokens-after"]) >= 0.6 * window
        kept = results(chat_view("responses", body))
        assert len(kept) == len(steps)
        assert sum(1 for text, step in zip(kept, steps, strict=True) if step.result[:200] in text) >= len(steps) / 2
