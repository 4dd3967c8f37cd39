"""Summaries of dropped history in the other API shapes the guard trims: asked for once per cut,
written in the request's own shape where the dropped items were, reused on the next turn."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from tests.server.conftest import gateway_settings, long_conversation

TRIM = {"summarize_dropped": True, "summariser": {"upstream": "fake", "model": "summary-writer"}}


def responses_body(messages: list[dict[str, str]]) -> dict[str, Any]:
    items = [{"type": "message", "role": m["role"], "content": m["content"]} for m in messages[1:]]
    return {"model": "gpt-4", "instructions": messages[0]["content"], "input": items}


async def post(proxy: Any, path: str, body: dict[str, Any]) -> int:
    async with aiohttp.ClientSession() as session, session.post(proxy.make_url(path), data=json.dumps(body)) as r:
        await r.read()
        return r.status


class TestResponsesSummaries:
    async def test_the_summary_is_a_system_item_where_the_dropped_items_were_and_is_reused(
        self, start_proxy, upstream, logs
    ):
        proxy = await start_proxy(gateway_settings(upstream.url, trim=TRIM))
        messages = long_conversation()
        assert await post(proxy, "/v1/responses", responses_body(messages)) == 200
        assert [r.path for r in upstream.received] == ["/v1/chat/completions", "/v1/responses"]
        sent = upstream.received[-1].json()
        summaries = [item for item in sent["input"] if item.get("role") == "system"]
        assert len(summaries) == 1 and "Hello from upstream." in summaries[0]["content"]
        at = sent["input"].index(summaries[0])
        assert sent["input"][: at - 1] == responses_body(messages)["input"][: at - 1]  # the opening before it
        assert sent["instructions"] == "You are a patient tutor."
        assert logs.events("request")[-1]["summary"]["status"] == "produced"

        more = [
            *messages,
            {"role": "assistant", "content": "It scatters blue light."},
            {"role": "user", "content": "Why?"},
        ]
        assert await post(proxy, "/v1/responses", responses_body(more)) == 200
        assert [r.path for r in upstream.received][2:] == ["/v1/responses"]  # no second summariser call
        assert logs.events("request")[-1]["summary"]["status"] == "reused"


def messages_body(messages: list[dict[str, str]]) -> dict[str, Any]:
    """Anthropic Messages with thinking before every answer, and Claude's edit that keeps it for the last turn only."""
    turns: list[dict[str, Any]] = []
    for k, m in enumerate(messages[1:]):
        if m["role"] == "assistant":
            thought = {"type": "thinking", "thinking": f"Thought {k}: " + "let me think " * 40, "signature": f"s{k}"}
            turns.append({"role": "assistant", "content": [thought, {"type": "text", "text": m["content"]}]})
        else:
            turns.append(m)
    edits = {"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}]}
    return {
        "model": "gpt-4",
        "max_tokens": 256,
        "system": messages[0]["content"],
        "messages": turns,
        "context_management": edits,
    }


class TestMessagesSummaries:
    async def test_a_summary_is_written_into_the_request_after_its_context_edits(self, start_proxy, upstream, logs):
        """An upstream that cannot edit: the guard's edits and its summary arrive together, the field gone."""
        proxy = await start_proxy(gateway_settings(upstream.url, trim=TRIM))
        messages = long_conversation()
        assert await post(proxy, "/v1/messages", messages_body(messages)) == 200
        assert [r.path for r in upstream.received] == ["/v1/chat/completions", "/v1/messages"]
        sent = upstream.received[-1].json()
        assert "context_management" not in sent
        assert any("Hello from upstream." in json.dumps(m) for m in sent["messages"])  # the summary
        assert sent["messages"][-1] == {"role": "user", "content": messages[-1]["content"]}
        answers = [m for m in sent["messages"] if m["role"] == "assistant" and isinstance(m["content"], list)]
        thought = [any(b["type"] == "thinking" for b in m["content"]) for m in answers]
        assert len(answers) > 1 and thought == [False] * (len(answers) - 1) + [True]  # the last turn's alone
        assert logs.events("request")[-1]["summary"]["status"] == "produced"
