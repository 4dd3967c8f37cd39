"""A provider that signs its calls (`Provider.signs`, as AWS SigV4 does): the guard signs every
forwarded request after its body is final, with credentials it looks up off the loop when they are
due, and the client's own signing headers never reach the upstream.

The provider here is a stand-in: it signs with an HMAC of the method, URL and body, which the
upstream checks on the bytes it received."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from typing import Any, ClassVar

import pytest
from aiohttp import web

from proxy.providers.local import Generic
from proxy.providers.provider import OutgoingCall
from tests.server.conftest import gateway_settings
from tests.server.raw_http import raw_request

SECRET = b"the guard's own credential"
CHAT = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).encode()
ANSWER = {
    "id": "c1",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
}


def signature(method: str, url: str, body: bytes, secret: bytes) -> str:
    return hmac.new(secret, b"\n".join([method.encode(), url.encode(), body]), hashlib.sha256).hexdigest()


class Keys:
    """Credentials that must be looked up (a blocking call) before they can be used, and say so."""

    def __init__(self, fails: bool) -> None:
        self.fails, self.found = fails, None
        self.lookups: list[str] = []  # the thread each lookup ran in

    def due(self) -> bool:
        return self.found is None

    def current(self) -> object:
        if self.found is None:
            self.lookups.append(threading.current_thread().name)
            if self.fails:
                raise LookupError("no credentials in this environment")
            self.found = SECRET
        return self.found


class Signing(Generic):
    signs: ClassVar[bool] = True

    def __init__(self, keys: Keys) -> None:
        self.keys = keys

    def signing_keys(self, upstream: object) -> Keys:
        return self.keys

    def finish(self, call: OutgoingCall, keys: object) -> OutgoingCall:
        assert isinstance(keys, bytes)
        headers = {k: v for k, v in call.headers.items() if not k.lower().startswith("x-amz-")}
        headers["x-signature"] = signature(call.method, call.url, call.body, keys)
        return OutgoingCall(call.method, call.url, headers, call.body)


def checking_upstream(received: list[dict[str, Any]]) -> web.Application:
    async def chat(request: web.Request) -> web.Response:
        body = await request.read()
        received.append({"headers": dict(request.headers), "body": body})
        expected = signature(request.method, str(request.url), body, SECRET)
        if request.headers.get("x-signature") != expected:
            return web.json_response({"error": {"message": "signature does not match"}}, status=403)
        return web.json_response(ANSWER)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


@pytest.fixture
def signed_proxy(aiohttp_server: Any, start_proxy: Any) -> Any:
    async def start(keys: Keys) -> tuple[Any, list[dict[str, Any]]]:
        received: list[dict[str, Any]] = []
        upstream = await aiohttp_server(checking_upstream(received))
        settings = gateway_settings(str(upstream.make_url("/v1")))
        object.__setattr__(settings.upstreams["fake"], "provider", Signing(keys))  # the kind's object, stood in
        return await start_proxy(settings), received

    return start


class TestSignedCalls:
    async def test_the_upstream_receives_the_request_signed_over_the_bytes_it_received(self, signed_proxy):
        proxy, received = await signed_proxy(Keys(fails=False))
        headers = {"Content-Type": "application/json", "X-Amz-Date": "20260101T000000Z"}
        response = await raw_request(proxy.port, "POST", "/v1/chat/completions", CHAT, headers)
        assert response.status == 200 and response.json()["choices"][0]["message"]["content"] == "ok"
        assert len(received) == 1 and "X-Amz-Date" not in received[0]["headers"]

    async def test_the_credentials_are_looked_up_once_off_the_loop_and_reused(self, signed_proxy):
        keys = Keys(fails=False)
        proxy, received = await signed_proxy(keys)
        for _ in range(3):
            response = await raw_request(proxy.port, "POST", "/v1/chat/completions", CHAT, {})
            assert response.status == 200
        assert len(keys.lookups) == 1 and len(received) == 3
        assert keys.lookups[0] != threading.main_thread().name  # off the event loop

    async def test_without_credentials_nothing_is_sent_and_the_client_is_told_why(self, signed_proxy, logs):
        proxy, received = await signed_proxy(Keys(fails=True))
        response = await raw_request(proxy.port, "POST", "/v1/chat/completions", CHAT, {})
        assert response.status == 502 and "could not obtain credentials" in response.json()["error"]["message"]
        assert received == []
        failure = next(iter(logs.events("signing_credentials_failed")))
        assert failure["reason"] == "LookupError" and "environment" not in json.dumps(failure)
