"""No lesson from an estimate: a request whose count includes a part the guard could only estimate
(here a video in a container it does not read, bounded from its size) may draw an overflow from
the provider that says it counted far more; the retry is cut to fit, but what the provider's
count says about that request is not taught to every other request of the model.

The control: the same exchange for a request counted without an estimate (its text alone) does
teach the count factor, so the next client's budget shrinks.
"""

from __future__ import annotations

import json
import os
from typing import Any

from aiohttp import web

from tests.adversarial.conftest import make_settings, post, prose
from tests.adversarial.media_files import b64

MODEL = "gemini-2.5-flash"
WINDOW = 40_000
FACTOR = 3.5  # how many times the guard's count the provider says it counted: plausible (at most 4)


class OverflowingGemini:
    """Answers the first request with Gemini's overflow error, claiming `FACTOR` times what the
    guard counted (`claim`, set by the test from the guard's own countTokens), and the rest with
    a reply."""

    def __init__(self) -> None:
        self.claim = 0
        self.received: list[dict[str, Any]] = []

    async def generate(self, request: web.Request) -> web.Response:
        self.received.append(await request.json())
        if len(self.received) == 1:
            message = f"The input token count ({self.claim}) exceeds the maximum number of tokens allowed ({WINDOW})."
            error = {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}
            return web.json_response({"error": error}, status=400)
        reply = {"content": {"role": "model", "parts": [{"text": "ok"}]}, "finishReason": "STOP"}
        usage = {"promptTokenCount": 1, "candidatesTokenCount": 1, "totalTokenCount": 2}
        return web.json_response({"candidates": [reply], "usageMetadata": usage})

    def app(self) -> web.Application:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_post("/v1beta/models/{method}", self.generate)
        return app


def settings(url: str) -> Any:
    upstream = {"base_url": url, "kind": "gemini", "read_timeout": 10, "connect_timeout": 2}
    overrides = [{"match": MODEL, "context_window": WINDOW}]
    return make_settings(url, upstreams={"google": upstream}, models={"overrides": overrides})


def conversation(last: list[dict[str, Any]]) -> dict[str, Any]:
    """Twenty-four turns of history (about 12,000 tokens, which a retry may cut) and `last`."""
    history = [
        {"role": "user" if i % 2 == 0 else "model", "parts": [{"text": f"{i} " + prose(2_000)}]} for i in range(24)
    ]
    return {"contents": [*history, {"role": "user", "parts": last}]}


async def budget_of_another_client(guard: Any) -> int:
    body = {"contents": [{"role": "user", "parts": [{"text": "hi"}]}]}
    status, answer, _ = await post(guard.url(f"/v1beta/models/{MODEL}:generateContent"), json.dumps(body).encode())
    assert status == 200, answer[:300]
    return await budget_header(guard, body)


async def budget_header(guard: Any, body: dict[str, Any]) -> int:
    import aiohttp

    async with (
        aiohttp.ClientSession() as session,
        session.post(guard.url(f"/v1beta/models/{MODEL}:generateContent"), json=body) as response,
    ):
        assert response.status == 200
        return int(response.headers["x-context-guard-budget"])


async def overflowed(serve_guard: Any, last: list[dict[str, Any]]) -> tuple[OverflowingGemini, Any, int]:
    """A guard whose upstream overflows the first request (`last` after the history); the budget
    another client then gets."""
    fake = OverflowingGemini()
    guard = await serve_guard(settings, upstream=fake.app())
    body = json.dumps(conversation(last)).encode()
    status, answer, _ = await post(guard.url(f"/v1beta/models/{MODEL}:countTokens"), body)
    assert status == 200, answer[:300]
    fake.claim = int(json.loads(answer)["totalTokens"] * FACTOR)
    status, answer, _ = await post(guard.url(f"/v1beta/models/{MODEL}:generateContent"), body)
    assert status == 200, answer[:300]
    assert len(fake.received) == 2 and len(fake.received[1]["contents"]) < len(fake.received[0]["contents"])
    return fake, guard, await budget_of_another_client(guard)


class TestAnOverflowOnAnEstimate:
    async def test_teaches_no_other_request_a_smaller_window(self, serve_guard):
        """A video the guard cannot read (an MPEG transport stream), bounded from its size."""
        video = {"inlineData": {"mimeType": "video/mp2t", "data": b64(os.urandom(30_000))}}
        _, _, budget = await overflowed(serve_guard, [video, {"text": "What happens in it?"}])
        assert budget > WINDOW / 2  # the model's window, less the output reserve: nothing learned

    async def test_on_a_count_without_an_estimate_it_does(self, serve_guard):
        """The control: the same overflow on text alone is believed, and every client is cut to it."""
        _, _, budget = await overflowed(serve_guard, [{"text": "What happened?"}])
        assert budget < WINDOW / FACTOR
