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
