"""Issue 39, item 6: one client cannot hold every upstream connection.

Before, one keyless client held all 1,024 upstream calls with slow streams, and another client
with its own key got `503 overloaded` after 5 s. One client now holds at most three quarters of
`server.upstream_connections`; here 8, so the attacker's seventh call waits, and the honest one
is served at once.
"""

from __future__ import annotations

import asyncio
import json

from aiohttp import web

from tests.adversarial.conftest import body_of, post


class SlowWhenAsked:
    """A chat upstream that holds a request whose message says "slow" until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.held = 0

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body["messages"][0]["content"] == "slow":
            self.held += 1
            await self.release.wait()
        choice = {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        return web.json_response({"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                                  "choices": [choice], "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                                                 "total_tokens": 2}})  # fmt: skip


async def test_a_second_client_is_served_within_2_s_while_another_holds_every_call_it_may(serve_guard, settings):
    slow = SlowWhenAsked()
    guard = await serve_guard(settings(server={"upstream_connections": 8, "connection_wait_seconds": 3}), slow.app())
    chat = guard.url("/v1/chat/completions")
    attacker = {"Authorization": "Bearer attacker-key"}
    held = [asyncio.create_task(post(chat, body_of("slow"), attacker)) for _ in range(8)]
    try:
        for _ in range(200):  # until the attacker holds its share
            if slow.held >= 6:
                break
            await asyncio.sleep(0.025)
        await asyncio.sleep(0.2)
        assert slow.held == 6, f"one client holds {slow.held} of 8 upstream calls"
        status, answer, seconds = await post(chat, body_of("hello"), {"Authorization": "Bearer honest-key"})
        assert status == 200 and json.loads(answer)["object"] == "chat.completion", answer[:300]
        assert seconds < 2.0
    finally:
        guard.loop.call_soon_threadsafe(slow.release.set)
        answers = await asyncio.gather(*held)
    assert [status for status, _, _ in answers] == [200] * 8  # the waiting two went once slots freed
