"""The provider's count at the budget's edge works on the body off the event loop: for a Claude
request at the edge carrying a large field the guard does not read (`mcp_servers`), the count
call's body is built, serialised and digested in the request's share of the threads, and that
digest is the count cache's key (so a cache hit does not dump or hash the body on the loop).
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from tests.adversarial.conftest import make_settings, post

CLAUDE = "claude-3-5-sonnet-20241022"


class AnthropicUpstream:
    """Answers Messages and its count endpoint (always 1,500 tokens: within the budget)."""

    def __init__(self) -> None:
        self.counted = 0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_post("/v1/messages/count_tokens", self.count)
        return app

    async def count(self, request: web.Request) -> web.Response:
        await request.read()
        self.counted += 1
        return web.json_response({"input_tokens": 1500})

    async def messages(self, request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"id": "m", "type": "message", "role": "assistant", "model": CLAUDE,
                                  "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
                                  "usage": {"input_tokens": 1, "output_tokens": 1}})  # fmt: skip


def edge_body() -> bytes:
    """About 1,900 tokens by Claude's bound with a window of 2,000: only the provider can tell; and
    9 MB of an MCP server's allowed tools in a field the guard does not count."""
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: " + "the river runs " * 20}
                for i in range(23)]  # fmt: skip
    tools = [f"tool_{i:012d}_name" for i in range(350_000)]  # 9 MB of names
    server = {"type": "url", "url": "https://mcp.example", "name": "big", "tool_configuration": {"allowed_tools": tools}}
    return json.dumps({"model": CLAUDE, "max_tokens": 100, "messages": messages, "mcp_servers": [server]}).encode()


async def test_a_request_at_the_edge_with_a_huge_unread_field_does_not_hold_the_loop(serve_guard, prober):
    fake = AnthropicUpstream()

    def settings(url: str) -> Any:
        upstream = {"base_url": url, "kind": "anthropic", "read_timeout": 10, "connect_timeout": 2,
                    "provider_count_ratio": 2.0}  # fmt: skip
        return make_settings(url, upstreams={"up": upstream},
                             models={"overrides": [{"match": "*", "context_window": 2000}]})  # fmt: skip

    guard = await serve_guard(settings, upstream=fake.app())
    body = edge_body()
    base = await prober.baseline(guard)
    async with prober.during(guard) as during:
        answers = [await post(guard.url("/v1/messages"), body) for _ in range(2)]  # the second: a count-cache hit
    assert [status for status, _, _ in answers] == [200, 200], answers[0][1][:300]
    assert fake.counted == 1  # asked once: the second was the cache's
    prober.assert_responsive(base, during)
