"""What a shape says of itself that the server acts on, each as Bedrock's shapes need it.

A shape whose streams are not server-sent events (`Adapter.stream_framing`, as AWS's event
stream is Bedrock's): the guard relays its frames whole, reads its usage from their payloads, and
ends a broken one with the shape's own closing frame. A shape that spells its usage as no other
does (`Adapter.answer_usage`, as Converse's `inputTokens`): the guard reads it there. And one that
names its errors in a header (`Adapter.error_headers`, as Bedrock's `x-amzn-ErrorType`). And one
that writes the path it is sent under itself (`Endpoint.sent_path`, as Bedrock's model ids, whose
`:` must reach the upstream encoded).

The framing here is a stand-in: each frame is a 4-byte big-endian length and a JSON payload; the
usage spelling is `{"metrics": {"in": N, "out": M}}`."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import pytest
from aiohttp import web

from proxy.apis import registry
from proxy.apis.endpoints import Endpoint, Shape, ShapeOptions
from proxy.apis.openai.chat import CHAT_PATHS, ChatAdapter
from proxy.errors import GuardError
from tests.server.conftest import gateway_settings
from tests.server.raw_http import raw_request

FRAMES = "application/x-length-frames"
STREAM = json.dumps({"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()


def frame(payload: dict[str, Any]) -> bytes:
    data = json.dumps(payload).encode()
    return len(data).to_bytes(4, "big") + data


def frames(data: bytes) -> list[dict[str, Any]]:
    """The payloads of `data`, read independently of the guard's framing."""
    found, at = [], 0
    while at < len(data):
        size = int.from_bytes(data[at : at + 4], "big")
        found.append(json.loads(data[at + 4 : at + 4 + size]))
        at += 4 + size
    assert at == len(data), "a frame was cut"
    return found


class LengthFraming:
    def __init__(self) -> None:
        self.ended, self._held = False, b""

    def feed(self, chunk: bytes) -> tuple[bytes, list[object]]:
        data, out, payloads, at = self._held + chunk, b"", [], 0
        while len(data) - at >= 4 and len(data) - at - 4 >= int.from_bytes(data[at : at + 4], "big"):
            size = int.from_bytes(data[at : at + 4], "big")
            payload = json.loads(data[at + 4 : at + 4 + size])
            payloads.append(payload)
            self.ended = self.ended or payload.get("end") is True
            out, at = out + data[at : at + 4 + size], at + 4 + size
        self._held = data[at:]
        return out, payloads

    def finish(self) -> bytes:
        return self._held


class FramedChat(ChatAdapter):
    def stream_framing(self, content_type: str) -> LengthFraming | None:
        return LengthFraming() if content_type == FRAMES else None

    def broken_stream_event(self, message: str) -> bytes:
        return frame({"error": message})

    def error_headers(self, error: GuardError) -> dict[str, str]:
        return {"x-shape-error": f"{type(error).__name__}:guard"}

    def answer_usage(self, payload: Mapping[str, Any]) -> tuple[int, int | None, int | None] | None:
        metrics = payload.get("metrics")
        return (metrics["in"], metrics["out"], None) if isinstance(metrics, dict) else None


def framed_chat(options: ShapeOptions) -> Shape:
    adapter = FramedChat()

    def by_id(path: str) -> Endpoint | None:  # `/v1/model/{id}/go`, sent as `/model/{id, encoded}/go`
        found = re.fullmatch(r"/v1/model/([^/]+)/go", path)
        if found is None:
            return None
        return Endpoint(adapter, found[1], sent_path=lambda model: f"/model/{quote(model or found[1], safe='')}/go")

    return Shape(adapter.name, (adapter,), dict.fromkeys(CHAT_PATHS, Endpoint(adapter)), by_id)


def framing_upstream(breaks: bool) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        if not json.loads(await request.read()).get("stream"):
            return web.json_response({"choices": [], "metrics": {"in": 9, "out": 3}})
        response = web.StreamResponse(headers={"Content-Type": FRAMES})
        await response.prepare(request)
        # One frame written in two pieces: the guard passes it on whole.
        first = frame({"delta": "hello"})
        await response.write(first[:3])
        await response.write(first[3:])
        if breaks:
            assert request.transport is not None
            request.transport.close()
            return response
        await response.write(frame({"metrics": {"in": 7, "out": 2}}) + frame({"end": True}))
        return response

    async def by_id(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"choices": [], "path": request.raw_path})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/model/{id}/go", by_id)
    return app


@pytest.fixture
def framed_proxy(aiohttp_server: Any, start_proxy: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(registry, "SHAPES", (framed_chat, *registry.SHAPES[1:]))

    async def start(breaks: bool) -> Any:
        upstream = await aiohttp_server(framing_upstream(breaks))
        return await start_proxy(gateway_settings(str(upstream.make_url("/v1"))))

    return start


class TestFramedStreams:
    async def test_its_frames_reach_the_client_whole_and_its_usage_is_read(self, framed_proxy, logs):
        proxy = await framed_proxy(breaks=False)
        response = await raw_request(proxy.port, "POST", "/v1/chat/completions", STREAM, {})
        assert response.status == 200 and response.headers["Content-Type"] == FRAMES
        assert frames(response.body) == [
            {"delta": "hello"},
            {"metrics": {"in": 7, "out": 2}},
            {"end": True},
        ]
        event = next(e for e in logs.events("request") if e["path"] == "/v1/chat/completions")
        assert event["provider_prompt_tokens"] == 7

    async def test_a_broken_one_ends_with_the_shape_s_own_closing_frame(self, framed_proxy):
        proxy = await framed_proxy(breaks=True)
        response = await raw_request(proxy.port, "POST", "/v1/chat/completions", STREAM, {})
        payloads = frames(response.body)
        assert payloads[0] == {"delta": "hello"} and "ended the stream early" in payloads[-1]["error"]


class TestTheShapesOwnUsage:
    async def test_a_whole_answer_s_usage_is_read_in_the_shape_s_spelling(self, framed_proxy, logs):
        proxy = await framed_proxy(breaks=False)
        whole = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).encode()
        response = await raw_request(proxy.port, "POST", "/v1/chat/completions", whole, {})
        assert response.status == 200 and response.json()["metrics"] == {"in": 9, "out": 3}
        event = next(e for e in logs.events("request") if e["path"] == "/v1/chat/completions")
        assert event["provider_prompt_tokens"] == 9


class TestTheShapesOwnErrors:
    async def test_a_refusal_carries_the_header_the_shape_names_its_errors_in(self, framed_proxy):
        proxy = await framed_proxy(breaks=False)
        response = await raw_request(proxy.port, "POST", "/v1/chat/completions", b'{"model": "gpt-4o"}', {})
        assert response.status == 400 and response.headers["x-shape-error"] == "BadRequest:guard"


class TestTheShapesOwnPath:
    async def test_the_upstream_receives_the_path_the_shape_writes_for_the_served_model(self, framed_proxy):
        proxy = await framed_proxy(breaks=False)
        model = "us.anthropic.claude-sonnet-4-5-v1:0"  # a `:` the upstream must receive encoded, as sent
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}]}).encode()
        response = await raw_request(proxy.port, "POST", "/v1/model/us.anthropic.claude-sonnet-4-5-v1%3A0/go", body, {})
        assert response.status == 200
        assert response.json()["path"] == f"/v1/model/{quote(model, safe='')}/go"
