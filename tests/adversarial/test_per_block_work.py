"""Work per content block is charged to the inline work budget, in every shape and in the count
endpoints: a re-sent 1 MiB message of tens of thousands of empty blocks is read and planned off
the event loop, as the same bytes in one text are cheap on it (the control)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from aiohttp import web

from tests.adversarial.conftest import post

BLOCKS = 31_000


def chat(blocks: list[dict[str, str]], seed: int) -> dict[str, object]:
    return {"model": "gpt-4o", "messages": [{"role": "user", "content": blocks}], "user": f"u{seed}"}


def messages(blocks: list[dict[str, str]], seed: int) -> dict[str, object]:
    return {"model": "claude-3-5-sonnet-20241022", "max_tokens": 16 + seed, "messages": [{"role": "user", "content": blocks}]}


def responses(blocks: list[dict[str, str]], seed: int) -> dict[str, object]:
    parts = [{"type": "input_text", "text": b["text"]} for b in blocks]
    return {"model": "gpt-4o", "input": [{"role": "user", "content": parts}], "user": f"u{seed}"}


def gemini(blocks: list[dict[str, str]], seed: int) -> dict[str, object]:
    return {"contents": [{"role": "user", "parts": [{"text": b["text"]} for b in blocks]}], "labels": {"s": str(seed)}}


SHAPES: dict[str, tuple[str, Callable[[list[dict[str, str]], int], dict[str, object]]]] = {
    "chat": ("/v1/chat/completions", chat),
    "messages": ("/v1/messages", messages),
    "messages count_tokens": ("/v1/messages/count_tokens", messages),
    "responses": ("/v1/responses", responses),
    "gemini": ("/v1beta/models/gemini-2.5-flash:generateContent", gemini),
    "gemini countTokens": ("/v1beta/models/gemini-2.5-flash:countTokens", gemini),
}


def quiet_upstream() -> web.Application:
    """An upstream that answers without reading the body: it shares the guard's loop in this
    harness, and the suite's fake upstream counts a chat body itself (31,000 parts: tens of ms)."""

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"id": "x", "object": "chat.completion", "choices": [], "usage": {}})

    app = web.Application(client_max_size=8 * 1024 * 1024)
    app.router.add_route("POST", "/{tail:.*}", answer)
    return app


def empty_blocks(seed: int) -> list[dict[str, str]]:
    return [{"type": "text", "text": "" if i else f"{seed}"} for i in range(BLOCKS)]


def one_text(seed: int) -> list[dict[str, str]]:
    return [{"type": "text", "text": f"{seed} " + "x" * (BLOCKS * 26)}]


async def resent(guard, shape: str, blocks: Callable[[int], list[dict[str, str]]], prober, baseline) -> None:
    path, build = SHAPES[shape]
    bodies = [json.dumps(build(blocks(seed), seed), separators=(",", ":")).encode() for seed in range(2)]
    assert all(len(body) < 1024 * 1024 for body in bodies)
    url = guard.url(path)
    for body in bodies:  # first sent: read and counted; what follows is a re-send
        status, answer, _ = await post(url, body)
        assert status < 500, answer[:300]
    async with prober.during(guard) as during:
        answers = [await post(url, body) for body in bodies for _ in range(2)]
    assert all(status < 500 for status, _, _ in answers), [a[:200] for _, a, _ in answers]
    prober.assert_responsive(baseline, during)


class TestManyEmptyBlocks:
    @pytest.mark.parametrize("shape", list(SHAPES))
    async def test_a_re_sent_message_of_empty_blocks_does_not_hold_the_loop(self, serve_guard, prober, shape):
        guard = await serve_guard(upstream=quiet_upstream())
        base = await prober.baseline(guard)
        await resent(guard, shape, empty_blocks, prober, base)

    @pytest.mark.parametrize("shape", ["chat", "messages"])
    async def test_the_same_bytes_in_one_text_do_not_hold_it_either(self, serve_guard, prober, shape):
        """The control: the bytes alone are cheap to read again."""
        guard = await serve_guard(upstream=quiet_upstream())
        base = await prober.baseline(guard)
        await resent(guard, shape, one_text, prober, base)
