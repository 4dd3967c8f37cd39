"""Credentials stay secret: token failures go to the operator's log, client keys never leave the proxy."""

from __future__ import annotations

import json
import sys

import pytest

from proxy.server.edge.credentials import holds_client_key, without_client_keys
from tests.server.conftest import gateway_settings
from tests.server.raw_http import raw_request

CHAT = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).encode()
JSON = {"Content-Type": "application/json"}
KEY = "cg-team-key-0123456789"


def token_upstream(url: str, **source: str) -> dict[str, object]:
    return {"upstreams": {"fake": {"base_url": url, **source}}}


def printing(text: str, code: int = 0, stderr: str = "") -> str:
    script = f"import sys; sys.stdout.write({text!r}); sys.stderr.write({stderr!r}); sys.exit({code})"
    return f"{sys.executable} -c {json.dumps(script)}"


class TestTokenFailures:
    @pytest.mark.parametrize(
        ("source", "reason"),
        [
            (
                {"token_command": printing("", 1, "ERROR: account ops@example.com, key /home/ops/creds.json")},
                "exited with 1",
            ),
            ({"token_command": printing("ya29.one\nya29.two\n")}, "one line; got 2 lines"),
            ({"token_command": printing("   \n")}, "empty"),
            ({"token_command": printing("ya29 with spaces\n")}, "cannot go in an HTTP header"),
            ({"token_command": "/nonexistent/gcloud auth print-access-token"}, "cannot start"),
            ({"token_file": "/nonexistent/token"}, "cannot be read"),
        ],
    )
    async def test_the_client_gets_a_generic_502_and_the_log_gets_the_reason(
        self, start_proxy, upstream, logs, source, reason
    ):
        proxy = await start_proxy(gateway_settings(upstream.url, **token_upstream(upstream.url, **source)))
        response = await raw_request(proxy.port, "POST", "/v1/chat/completions", CHAT, JSON)
        error = response.json()["error"]
        request_id = response.headers["x-request-id"]
        assert response.status == 502 and error["code"] == "upstream_unavailable"
        assert "operator's log" in error["message"] and request_id in error["message"]
        assert "ops@example.com" not in response.body.decode() and "ya29" not in response.body.decode()
        assert reason in logs.events("token_refresh_failed")[-1]["reason"] and upstream.received == []

    async def test_a_single_line_token_is_sent(self, start_proxy, upstream):
        proxy = await start_proxy(
            gateway_settings(upstream.url, **token_upstream(upstream.url, token_command=printing("ya29.ok\n")))
        )
        assert (await raw_request(proxy.port, "POST", "/v1/chat/completions", CHAT, JSON)).status == 200
        assert upstream.received[-1].headers["Authorization"] == "Bearer ya29.ok"


class TestClientKeys:
    @pytest.mark.parametrize("header", [{"Authorization": f"Bearer {KEY}"}, {"x-api-key": KEY}, {"api-key": KEY}])
    def test_a_key_is_accepted_from_each_header(self, header):
        assert holds_client_key(header, [KEY]) and not holds_client_key(header, ["other"])

    def test_query_parameters_holding_a_key_are_removed_and_the_rest_kept_as_given(self):
        query = f"api_key={KEY}&key={KEY}&api-version=2024%2D10&x&other={KEY}%20"
        assert without_client_keys(query, [KEY]) == "api-version=2024%2D10&x"

    @pytest.fixture
    async def keyed_proxy(self, start_proxy, upstream):
        return await start_proxy(gateway_settings(upstream.url, server={"client_keys": [KEY]}))

    @pytest.mark.parametrize("header", ["Authorization", "x-api-key", "api-key"])
    async def test_the_key_in_any_header_is_accepted_and_never_forwarded(self, keyed_proxy, upstream, header):
        value = f"Bearer {KEY}" if header == "Authorization" else KEY
        headers = {**JSON, header: value, "X-Custom-Auth": f"Token {KEY}"}
        response = await raw_request(keyed_proxy.port, "POST", "/v1/chat/completions", CHAT, headers)
        assert response.status == 200
        assert KEY not in json.dumps(upstream.received[-1].headers)

    async def test_the_key_in_the_query_string_is_never_forwarded(self, keyed_proxy, upstream):
        response = await raw_request(
            keyed_proxy.port, "GET", f"/v1/models?api_key={KEY}&key={KEY}&limit=5", headers={"x-api-key": KEY}
        )
        assert response.status == 200 and upstream.received[-1].raw_query == "limit=5"

    async def test_a_wrong_key_in_any_header_is_a_401(self, keyed_proxy, upstream):
        for header in ("x-api-key", "api-key", "Authorization"):
            response = await raw_request(
                keyed_proxy.port, "POST", "/v1/chat/completions", CHAT, {**JSON, header: "Bearer nope"}
            )
            assert response.status == 401
        assert upstream.received == []
