"""An opted-in window applies only where the provider honours it: Anthropic's 1M-context beta
header raises Claude Sonnet 4.5's budget on an Anthropic upstream (the control), and on no other
kind of upstream, where the header asks nothing and the model keeps its 200,000. A correction
learned on a request that opted in stays with such requests: the model's other requests keep
their own window.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from aiohttp import web

from tests.adversarial.conftest import make_settings

MODEL = "claude-sonnet-4-5"
BETA = {"anthropic-beta": "context-1m-2025-08-07"}


class Anthropic:
    """Answers as Anthropic's Messages API; with `limit` set, the first conversation (a request of
    more than one message) is refused as too long for that window (its prompt said to be `claim`
    tokens), the rest answered."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = limit
        self.claim = 0
        self.refused = False
        self.received: list[dict[str, Any]] = []

    async def messages(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.received.append(body)
        if self.limit is not None and not self.refused and len(body["messages"]) > 1:
            self.refused = True
            message = f"prompt is too long: {self.claim} tokens > {self.limit} maximum"
            error = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
            return web.json_response(error, status=400)
        reply = {"id": "msg_1", "type": "message", "role": "assistant", "model": MODEL, "stop_reason": "end_turn",
                 "content": [{"type": "text", "text": "ok"}], "usage": {"input_tokens": 1, "output_tokens": 1}}  # fmt: skip
        return web.json_response(reply)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/{path:.*}messages", self.messages)
        return app


def settings_for(kind: str) -> Any:
    def build(url: str) -> Any:
        upstream = {"base_url": f"{url}/v1" if kind != "anthropic" else url, "kind": kind, "read_timeout": 10}
        return make_settings(url, upstreams={"up": upstream})

    return build


async def budget(guard: Any, headers: dict[str, str], messages: list[dict[str, Any]] | None = None) -> int:
    body = {"model": MODEL, "max_tokens": 64, "messages": messages or [{"role": "user", "content": "hi"}]}
    async with (
        aiohttp.ClientSession() as session,
        session.post(guard.url("/v1/messages"), json=body, headers=headers) as response,
    ):
        assert response.status == 200, (await response.read())[:300]
        return int(response.headers["x-context-guard-budget"])


async def count_tokens(guard: Any, messages: list[dict[str, Any]]) -> int:
    body = {"model": MODEL, "messages": messages}
    async with (
        aiohttp.ClientSession() as session,
        session.post(guard.url("/v1/messages/count_tokens"), json=body, headers=BETA) as response,
    ):
        assert response.status == 200
        return int((await response.json())["input_tokens"])


class TestTheBetaHeader:
    async def test_opens_a_million_tokens_on_an_anthropic_upstream(self, serve_guard):
        """The control: Anthropic honours it."""
        guard = await serve_guard(settings_for("anthropic"), upstream=Anthropic().app())
        assert await budget(guard, BETA) > 900_000
        assert await budget(guard, {}) < 200_000

    async def test_opens_nothing_on_an_upstream_of_another_kind(self, serve_guard):
        """An OpenAI-compatible server serving the Messages shape does not read Anthropic's betas."""
        guard = await serve_guard(settings_for("generic"), upstream=Anthropic().app())
        assert await budget(guard, BETA) < 200_000


class TestACorrectionLearnedWithTheBeta:
    async def test_applies_to_requests_that_opted_in_and_to_no_other(self, serve_guard):
        """An upstream that says an opted-in request counted 3.6 times the guard's count, over a
        30,000-token window: learned for such requests; the model's own window is kept for the others."""
        fake = Anthropic(limit=30_000)
        guard = await serve_guard(settings_for("anthropic"), upstream=fake.app())
        before = await budget(guard, {})
        history = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} " + "word " * 200} for i in range(40)]
        messages = [*history, {"role": "user", "content": "and now?"}]
        counted = await count_tokens(guard, messages)
        fake.claim = int(counted * 3.6)
        await budget(guard, BETA, messages)
        assert len(fake.received) == 3  # "hi", the conversation refused, retried cut to the learned window
        assert json.dumps(fake.received[2]).count("turn ") < 40
        assert await budget(guard, {}) == before
        assert await budget(guard, BETA) < 30_000 / 3.6
