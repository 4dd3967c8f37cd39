"""Traffic for the page of recent decisions: a plain chat POST, and five requests (trimmed, rejected,
plain) with request ids the page tests look for."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from tests.server.conftest import long_conversation

SECRET_WORDS = "explain the water cycle in detail"  # in every user turn of long_conversation()


async def chat(proxy: Any, body: dict[str, Any], request_id: str | None = None) -> int:
    headers = {"x-request-id": request_id} if request_id else {}
    async with aiohttp.ClientSession() as session:
        async with session.post(proxy.make_url("/v1/chat/completions"), data=json.dumps(body), headers=headers) as r:
            await r.read()
            return r.status


async def make_traffic(proxy: Any) -> dict[str, str]:
    """Two trimmed, one rejected and two plain requests, with request ids the test can look for."""
    hi = [{"role": "user", "content": "hi"}]
    huge_system = [{"role": "system", "content": "rule " * 20_000}, *hi]  # shrink_system is not in the pipeline
    sent = {
        "trim-1": {"model": "gpt-4", "messages": long_conversation()},
        "plain-1": {"model": "gpt-4o", "messages": hi},
        "reject-1": {"model": "gpt-4", "messages": huge_system},
        "trim-2": {"model": "gpt-4", "messages": long_conversation(60)},
        "plain-2": {"model": "gpt-4o-mini", "messages": hi},
    }
    statuses = {rid: await chat(proxy, body, rid) for rid, body in sent.items()}
    assert statuses == {"trim-1": 200, "plain-1": 200, "reject-1": 400, "trim-2": 200, "plain-2": 200}
    return {
        "trim-1": "trimmed",
        "plain-1": "unchanged",
        "reject-1": "rejected",
        "trim-2": "trimmed",
        "plain-2": "unchanged",
    }


TOOL_OUTPUT = "PASSED tests/test_module.py::test_case " * 60  # about 600 tokens a result


def agent_loop(steps: int = 24) -> list[dict[str, Any]]:
    """A user prompt and `steps` tool calls (run_tests and read_file in turn) with long results."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Make the test suite pass."},
    ]
    for i in range(steps):
        tool = ("run_tests", "read_file")[i % 2]
        call = {"id": f"call_{i}", "type": "function", "function": {"name": tool, "arguments": "{}"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": f"{i}: {TOOL_OUTPUT}"})
    return messages


async def post(proxy: Any, path: str, body: Any, request_id: str, headers: dict[str, str] | None = None) -> int:
    sent = {"x-request-id": request_id, **(headers or {})}
    async with aiohttp.ClientSession() as session:
        async with session.post(proxy.make_url(path), data=json.dumps(body), headers=sent) as r:
            await r.read()
            return r.status


async def make_every_kind(proxy: Any) -> dict[str, str]:
    """One request of each thing the guard does: a streamed history trimmed, an agent's old tool
    results cleared, a body refused, a count answered without forwarding; by request id, the
    outcome each must show."""
    chat_path = "/v1/chat/completions"
    anthropic = {"anthropic-version": "2023-06-01"}
    long_chat = {"model": "gpt-4", "messages": long_conversation(), "stream": True}
    statuses = {
        "kind-trimmed": await post(proxy, chat_path, long_chat, "kind-trimmed"),
        "kind-cleared": await post(proxy, chat_path, {"model": "gpt-4", "messages": agent_loop()}, "kind-cleared"),
        "kind-refused": await post(proxy, chat_path, {"model": "gpt-4o", "messages": "not a list"}, "kind-refused"),
        "kind-counted": await post(
            proxy,
            "/v1/messages/count_tokens",
            {"model": "claude-sonnet-4-6", "messages": [{"role": "user", "content": "hi " * 3000}]},
            "kind-counted",
            anthropic,
        ),
    }
    assert statuses == {"kind-trimmed": 200, "kind-cleared": 200, "kind-refused": 400, "kind-counted": 200}
    return {
        "kind-trimmed": "trimmed",
        "kind-cleared": "trimmed",
        "kind-refused": "refused",
        "kind-counted": "answered_locally",
    }
