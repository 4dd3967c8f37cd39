"""A client's model name never steers an upstream request off its model's own path.

For every upstream kind, a model name holding `..`, `?`, `#` or a `:` verb (which, written
unquoted into a path such as `.../publishers/google/models/{name}:countTokens`, would send the
client's body with the operator's credential to another project's `:predict`, an Anthropic
`:rawPredict` or a `:generateContent`) is sent: every request the upstream receives is recorded,
and each must be the forwarded request's path or the model's own count path.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from aiohttp import web

from tests.adversarial.conftest import make_settings, post

VERTEX_BASE = "/v1/projects/p/locations/us-central1/endpoints/openapi"
VERTEX_COUNT = "/v1/projects/p/locations/us-central1/publishers/google/models/{}:countTokens"
HOSTILE = [
    "gemini-2.5-pro:predict?alt=",
    "../../../../projects/other/locations/us/publishers/anthropic/models/claude:rawPredict#",
    "google/../../../publishers/google/models/gemini-2.5-pro:generateContent",
    "gemini/../../x",
    "google/gemini%2F..%2Fx",
    "gemini-2.5-pro#fragment",
    "gemini 2.5 pro",
    "gemini\t2.5",
    "..",
    "gemini..pro",
    "gemini-2.5-pro/",
    "gemini-2.5-pro\n",
]


class RecordingUpstream:
    """Answers every POST as its kind's chat, messages or count endpoint would, and records its path."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.Response:
        self.paths.append(request.raw_path)
        body: dict[str, Any] = await request.json() if request.can_read_body else {}
        path = request.path
        if path.endswith(":countTokens"):
            return web.json_response({"totalTokens": 1500})
        if path.endswith(("/count_tokens", "/input_tokens")):
            return web.json_response({"input_tokens": 1500})
        if path.endswith("/messages"):
            usage = {"input_tokens": 1, "output_tokens": 1}
            return web.json_response({"id": "m", "type": "message", "role": "assistant", "model": body.get("model"),
                                      "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
                                      "usage": usage})  # fmt: skip
        choice = {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        return web.json_response({"id": "c", "object": "chat.completion", "created": 0, "model": body.get("model"),
                                  "choices": [choice], "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                                                 "total_tokens": 2}})  # fmt: skip


def conversation() -> list[dict[str, str]]:
    """About 1,500 tokens: between its bounds, a window of 2,000 can only be decided by the provider."""
    turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}: " + "the river runs " * 20}
             for i in range(24)]  # fmt: skip
    return [*turns, {"role": "user", "content": "and now?"}]


# kind: (upstream base path, client path, forwarded path, count path of a model)
KINDS = {
    "vertex": (VERTEX_BASE, "/v1/chat/completions", VERTEX_BASE + "/chat/completions", VERTEX_COUNT.format),
    "anthropic": ("/v1", "/v1/messages", "/v1/messages", lambda _: "/v1/messages/count_tokens"),
    "openai": ("/v1", "/v1/chat/completions", "/v1/chat/completions", lambda _: "/v1/responses/input_tokens"),
}


@pytest.mark.parametrize("kind", list(KINDS))
async def test_no_upstream_request_leaves_the_models_own_paths_whatever_its_name(serve_guard, kind):
    base, client_path, forwarded, count_path = KINDS[kind]
    fake = RecordingUpstream()

    def settings(url: str) -> Any:
        root = url[: -len("/v1")]
        upstream = {"base_url": root + base, "kind": kind, "read_timeout": 5, "connect_timeout": 2,
                    "provider_count_ratio": 2.0}  # fmt: skip
        return make_settings(url, upstreams={"up": upstream},
                             models={"overrides": [{"match": "*", "context_window": 2000}]})  # fmt: skip

    guard = await serve_guard(settings, upstream=fake.app())
    # gemini-exp-1206: a Gemini no SDK maps, counted by its bound (gemini-2.5-pro has its vocabulary and fits)
    honest = "gemini-exp-1206" if kind == "vertex" else "some-model-1"
    for name in [honest, *HOSTILE]:
        body = {"model": name, "max_tokens": 100, "messages": conversation()}
        status, answer, _ = await post(guard.url(client_path), json.dumps(body).encode())
        assert status in (200, 400), answer[:300]  # forwarded, or refused in the API's shape
        allowed = {forwarded, count_path(name if name == honest else honest)}
        strays = [path for path in fake.paths if path not in allowed]
        assert not strays, f"model {name!r} sent the guard to {strays}"
    assert count_path(honest) in fake.paths  # the honest name was asked about: the check is not vacuous
