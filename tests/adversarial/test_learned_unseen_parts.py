"""Learned state comes only from what was counted.

A part the guard cannot see (a file sent by `file_id`) is counted as 0, yet the provider counts
it: its overflow error then implies a count factor that is about that one request. The guard
retries that request cut to fit, and remembers for every other client at most the window the
provider stated, never the factor.
"""

# ruff: noqa: F811  # fixtures imported from tests/server/conftest.py, named again as parameters

from __future__ import annotations

import json
import math
from typing import Any

import aiohttp

from tests.server.conftest import (  # noqa: F401  # fixtures: the real app in front of a real fake upstream
    gateway_settings,
    logs,
    long_conversation,
    start_proxy,
    upstream,
)
from tests.support.llama import LlamaLike
from tests.support.upstream import FakeUpstream

FILE_TOKENS = 4000  # what the provider finds in the file it fetches by id
GPT4_BUDGET = 8192 - 1228 - 410  # gpt-4's window less the default output reserve and safety margin


class FileReadingUpstream(FakeUpstream):
    """Counts a file sent by id as the provider does: by what the file holds."""

    def provider_count(self, body: dict[str, Any]) -> int:
        files = sum(
            1
            for message in body["messages"]
            if isinstance(message.get("content"), list)
            for part in message["content"]
            if part.get("type") == "file" and "file_id" in part.get("file", {})
        )
        return super().provider_count(body) + files * FILE_TOKENS


async def chat(proxy: Any, body: dict[str, Any], key: str) -> tuple[int, dict[str, str]]:
    headers = {"Authorization": f"Bearer {key}"}
    async with aiohttp.ClientSession() as session:
        async with session.post(proxy.make_url("/v1/chat/completions"), data=json.dumps(body), headers=headers) as r:
            await r.read()
            return r.status, dict(r.headers)


class TestAPartTheGuardCannotSee:
    async def test_teaches_no_count_factor_to_other_clients(self, aiohttp_server, start_proxy, logs):
        fake = FileReadingUpstream(limit=8192, provider_factor=1.0)
        url = str((await aiohttp_server(fake.app())).make_url("/v1"))
        proxy = await start_proxy(gateway_settings(url))
        messages = long_conversation(54)
        messages[-1] = {
            "role": "user",
            "content": [
                {"type": "text", "text": "Summarise the attached report."},
                {"type": "file", "file": {"file_id": "file-abc123"}},
            ],
        }
        for _ in range(3):  # the attacker, again and again
            status, _ = await chat(proxy, {"model": "gpt-4", "messages": messages}, "attacker")
            assert status == 200
        attack = logs.events("request")[0]
        assert attack["unseen_parts"] == ["messages[109].content[1]: file by id or URL"]
        factor = attack["self_correction"]["factor"]
        assert factor > 1.3  # the provider's count implied a factor: true of that request alone
        assert len(fake.received) == 6 and all(r.json()["messages"][-1] == messages[-1] for r in fake.received)

        status, headers = await chat(proxy, {"model": "gpt-4", "messages": long_conversation(54)}, "honest")
        assert status == 200 and int(headers["x-context-guard-budget"]) == GPT4_BUDGET
        honest = logs.events("request")[-1]
        assert "applied_correction" not in honest and honest["window_source"] == "model_map"
        # what the factor would have cost the honest client
        assert math.floor(8192 / (factor * 1.02)) < GPT4_BUDGET


class FileReadingServer(LlamaLike):
    """A server whose `usage` counts what a file sent by id holds (an estimate-counted model)."""

    window = 100_000

    @staticmethod
    def count(body: dict[str, Any]) -> int:
        files = sum(1 for m in body["messages"] if isinstance(m.get("content"), list) for p in m["content"]
                    if p.get("type") == "file")  # fmt: skip
        plain = sum(len(m["content"]) for m in body["messages"] if isinstance(m.get("content"), str))
        return plain // 4 + files * FILE_TOKENS


class TestAPartTheGuardCannotSeeInAnAnswersUsage:
    async def test_calibrates_no_other_clients_estimate(self, aiohttp_server, start_proxy, logs):
        url = str((await aiohttp_server(FileReadingServer().app())).make_url("/v1"))
        proxy = await start_proxy(gateway_settings(url))
        question = {"role": "user", "content": "tell me about rivers " * 40}
        attached = {"role": "user", "content": [{"type": "file", "file": {"file_id": "file-abc123"}}]}
        for _ in range(3):
            status, _ = await chat(proxy, {"model": "local-model", "messages": [attached, question]}, "attacker")
            assert status == 200
        assert logs.events("request")[0]["provider_prompt_tokens"] > FILE_TOKENS
        status, _ = await chat(proxy, {"model": "local-model", "messages": [question]}, "honest")
        honest = logs.events("request")[-1]
        assert status == 200 and honest["count_source"] == "estimate"  # not scaled by what the attacker taught
