"""A learned window is never skipped.

In front of a llama.cpp server whose window the guard does not know (it assumes the 8,192-token
fallback), the server's overflow error teaches the window (2,048 stated: 2,007 with the headroom).
Every later request is budgeted against the learned window, whatever it holds: a request with
tools whose count exceeds the learned window is refused with the learned window's numbers, not
budgeted against the fallback and forwarded.
"""

# ruff: noqa: F811  # fixtures imported from tests/server/conftest.py, named again as parameters

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.server.conftest import gateway_settings, logs, long_conversation, start_proxy  # noqa: F401  # fixtures

N_CTX = 2048
LEARNED = int(N_CTX / 1.02)  # 2,007


class LlamaServer:
    """Answers as llama.cpp's llama-server does past its window, with its structured error (an
    over-window stream: the same error, before any byte). It counts a token per 4 bytes of the
    messages and tools it is sent, an independent count, not the guard's."""

    def __init__(self) -> None:
        self.received: list[dict[str, Any]] = []

    @staticmethod
    def count(body: dict[str, Any]) -> int:
        return len(json.dumps([body["messages"], body.get("tools", [])])) // 4

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.received.append(body)
        prompt = self.count(body)
        if prompt > N_CTX:
            error = {"code": 400, "message": "the request exceeds the available context size, try increasing it",
                     "type": "exceed_context_size_error", "n_prompt_tokens": prompt, "n_ctx": N_CTX}  # fmt: skip
            return web.json_response({"error": error}, status=400)
        choice = {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        return web.json_response({"choices": [choice], "usage": {"prompt_tokens": prompt, "completion_tokens": 1}})

    async def tokenize_count(self, request: web.Request) -> web.Response:
        """llama-cpp-python's `/extras/tokenize/count`: with it, discovery finds a server whose own
        tokenizer counts (kind `auto`)."""
        return web.json_response({"count": len((await request.json())["input"]) // 4})

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        app.router.add_post("/extras/tokenize/count", self.tokenize_count)
        return app


def tools(count: int) -> list[dict[str, Any]]:
    parameters = {"type": "object", "properties": {"order_id": {"type": "string", "description": "the order"}}}
    return [
        {
            "type": "function",
            "function": {"name": f"lookup_{i}", "description": "Looks an order up. " * 12, "parameters": parameters},
        }
        for i in range(count)
    ]


async def post(proxy: Any, body: dict[str, Any]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.post(proxy.make_url("/v1/chat/completions"), json=body) as r:
        return r.status, await r.read()


class TestALearnedWindow:
    @pytest.mark.parametrize("kind", ["auto", "llamacpp", "generic"])
    async def test_holds_for_a_request_whose_tools_alone_exceed_it(self, aiohttp_server, start_proxy, logs, kind):
        fake = LlamaServer()
        url = str((await aiohttp_server(fake.app())).make_url("/v1"))
        proxy = await start_proxy(gateway_settings(url, upstreams={"llama": {"base_url": url, "kind": kind}}))
        status, _ = await post(proxy, {"model": "local", "messages": long_conversation(20)})
        assert status == 200
        learned = logs.events("request")[0]["self_correction"]
        assert learned["provider_limit"] == N_CTX and learned["corrected_window"] <= LEARNED

        body = {"model": "local", "messages": [{"role": "user", "content": "Where is order 7?"}], "tools": tools(16)}
        status, answer = await post(proxy, body)
        event = logs.events("request")[-1]
        assert event["tokens_before"] > learned["corrected_window"]  # its tools alone: nothing the guard may cut
        assert event["context_window"] == learned["corrected_window"] and event["window_source"] == "correction"
        assert (
            status == 400
            and f"context window {learned['corrected_window']:,}" in json.loads(answer)["error"]["message"]
        )
        assert not any("tools" in sent for sent in fake.received)  # it never went
