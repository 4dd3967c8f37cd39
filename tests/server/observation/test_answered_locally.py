"""A request the guard answers itself (Anthropic's count_tokens, Gemini's countTokens) is counted,
never cut nor forwarded: its log line, headers and row say so, and a trimmed request's say what
kind of cut each removal was, in the same words."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from proxy.server.observation.page import JSON_PATH
from tests.server.conftest import gateway_settings, long_conversation
from tests.support.page_traffic import agent_loop

ANTHROPIC = {"anthropic-version": "2023-06-01"}
LONG = [{"role": "user", "content": "explain the water cycle in detail " * 3000}]  # over gpt-4's budget


async def post(proxy: Any, path: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.post(proxy.make_url(path), data=json.dumps(body), headers=headers) as r:
            text = await r.text()
            return r.status, (r.headers, json.loads(text) if not text.startswith("data:") else text)


async def rows(proxy: Any) -> dict[str, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.get(proxy.make_url(JSON_PATH)) as r:
        return {row["request_id"]: row for row in (await r.json())["rows"]}


class TestAnsweredLocally:
    async def test_a_count_over_the_budget_is_answered_with_its_count_and_nothing_removed(self, proxy, upstream, logs):
        body = {"model": "claude-sonnet-4-6", "messages": LONG * 40}
        status, (headers, answer) = await post(
            proxy, "/v1/messages/count_tokens", body, {**ANTHROPIC, "x-request-id": "count-1"}
        )
        assert status == 200 and headers["x-context-guard-outcome"] == "answered_locally"
        (event,) = logs.events("request")
        assert event["outcome"] == "answered_locally" and event["tokens_counted"] == answer["input_tokens"]
        assert "removed" not in event and "removed_count" not in event and "tokens_after" not in event
        row = (await rows(proxy))["count-1"]
        assert (row["outcome"], row["tokens_counted"], row["removed_count"]) == (
            "answered_locally",
            answer["input_tokens"],
            0,
        )
        assert upstream.received == []  # never forwarded

    async def test_a_gemini_count_is_answered_locally_too(self, proxy, logs):
        body = {"contents": [{"role": "user", "parts": [{"text": "explain the water cycle " * 4000}]}]}
        status, (headers, answer) = await post(proxy, "/v1beta/models/gemini-2.5-flash:countTokens", body, {})
        assert status == 200 and headers["x-context-guard-outcome"] == "answered_locally"
        (event,) = logs.events("request")
        assert event["outcome"] == "answered_locally" and event["tokens_counted"] == answer["totalTokens"]


class TestOneVocabularyOfCuts:
    async def test_the_headers_count_each_kind_of_cut_the_log_names(self, proxy, logs):
        status, (headers, _) = await post(
            proxy, "/v1/chat/completions", {"model": "gpt-4", "messages": agent_loop()}, {}
        )
        assert status == 200 and headers["x-context-guard-outcome"] == "trimmed"
        (event,) = logs.events("request")
        kinds: dict[str, int] = {}
        for run in event["removed"]:
            kinds[run["kind"]] = kinds.get(run["kind"], 0) + run.get("count", 1)
        for kind in ("cleared", "dropped", "truncated"):
            assert int(headers[f"x-context-guard-{kind}"]) == kinds.get(kind, 0), kind
        assert int(headers["x-context-guard-removed"]) == sum(kinds.values()) == event["removed_count"]

    async def test_a_refused_body_keeps_the_model_it_named(self, proxy):
        body = {"model": "gpt-4o", "messages": "not a list"}
        status, _ = await post(proxy, "/v1/chat/completions", body, {"x-request-id": "refused-1"})
        row = (await rows(proxy))["refused-1"]
        assert status == 400 and (row["outcome"], row["model"], row["error"]) == (
            "refused",
            "gpt-4o",
            "invalid_request",
        )

    async def test_a_row_says_it_streamed_and_what_each_removed_run_held(self, proxy):
        body = {"model": "gpt-4", "messages": long_conversation(), "stream": True}
        status, _ = await post(proxy, "/v1/chat/completions", body, {"x-request-id": "stream-1"})
        row = (await rows(proxy))["stream-1"]
        assert status == 200 and row["stream"] is True
        (run,) = row["removed"]
        assert run["kind"] == "dropped" and run["roles"] == {"user": run["count"] // 2, "assistant": run["count"] // 2}

    async def test_the_outcome_header_is_the_log_lines_in_dry_run_too(self, start_proxy, upstream, logs):
        proxy = await start_proxy(gateway_settings(upstream.url, trim={"mode": "dry_run"}))
        body = {"model": "gpt-4", "messages": long_conversation()}
        status, (headers, _) = await post(proxy, "/v1/chat/completions", body, {})
        (event,) = logs.events("request")
        assert status == 200 and headers["x-context-guard-outcome"] == event["outcome"] == "dry_run_trimmed"
