"""One client cannot hold every upstream connection: it holds at most three quarters of
`server.upstream_connections` (here 8, so the attacker's seventh call waits), and another
client is served while the attacker's calls are still held.
"""

from __future__ import annotations

import asyncio
import json
import threading

from aiohttp import web

from tests.adversarial.conftest import body_of, post


class SlowWhenAsked:
    """A chat upstream that holds a request whose message says "slow" until released."""

    def __init__(self, share: int) -> None:
        self.release = asyncio.Event()
        self.held = 0
        self.share_held = threading.Event()  # set once `share` requests are held (read from the test's loop)
        self.share = share

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        if body["messages"][0]["content"] == "slow":
            self.held += 1
            if self.held >= self.share:
                self.share_held.set()
            await self.release.wait()
        choice = {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        return web.json_response({"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
                                  "choices": [choice], "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                                                 "total_tokens": 2}})  # fmt: skip


async def test_a_second_client_is_served_while_another_holds_every_call_it_may(serve_guard, settings):
    """The honest call is answered before any of the attacker's is released; had it waited for a
    connection, `connection_wait_seconds` would have ended it in a 503."""
    slow = SlowWhenAsked(share=6)
    guard = await serve_guard(settings(server={"upstream_connections": 8, "connection_wait_seconds": 3}), slow.app())
    chat = guard.url("/v1/chat/completions")
    attacker = {"Authorization": "Bearer attacker-key"}
    held = [asyncio.create_task(post(chat, body_of("slow"), attacker)) for _ in range(8)]
    try:
        assert await asyncio.to_thread(slow.share_held.wait, 30), f"the attacker holds only {slow.held} calls"
        status, answer, _ = await post(chat, body_of("hello"), {"Authorization": "Bearer honest-key"})
        assert status == 200 and json.loads(answer)["object"] == "chat.completion", answer[:300]
        assert slow.held == 6, f"one client holds {slow.held} of 8 upstream calls"
    finally:
        guard.loop.call_soon_threadsafe(slow.release.set)
        answers = await asyncio.gather(*held)
    assert [status for status, _, _ in answers] == [200] * 8  # the waiting two went once slots freed
