"""Attacks on the operator's Google credential (`kind: vertex` with `token_command` or `auth: adc`),
over real sockets, each beside its control: a client used to pick the project the operator's token
was spent in (a path naming `projects/OTHER/locations/...`), its billing project
(`x-goog-user-project`), and to send its own `?key=` or `x-goog-api-key` beside the operator's
token. Now the token goes only into the project and location the base URL names, refused in
Google's shape otherwise, and nothing of the client's credentials travels beside it."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from proxy.config.settings import settings_from_dict
from proxy.server.edge import adc
from tests.adversarial.conftest import CLIENT_TIMEOUT
from tests.support.gemini_upstream import FakeGemini

FLASH = "gemini-2.5-flash"
OWN = "/v1/projects/my-project/locations/us-central1"
BODY = {"contents": [{"role": "user", "parts": [{"text": "hello"}]}]}


async def call(
    url: str, method: str = "POST", body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    async with aiohttp.ClientSession(timeout=CLIENT_TIMEOUT) as session:
        async with session.request(method, url, json=body, headers=headers or {}) as response:
            text = await response.text()
            return response.status, json.loads(text) if text else None


def generate(prefix: str) -> str:
    return f"{prefix}/publishers/google/models/{FLASH}:generateContent"


@pytest.fixture
def vertex(serve_guard: Any) -> Any:
    """A guard in front of a fake Vertex AI, its upstream configured by `base` (a path under the
    fake's root) and `auth` (the credential settings)."""

    async def start(base: str = f"{OWN}/endpoints/openapi", **auth: Any) -> tuple[Any, FakeGemini]:
        provider = FakeGemini()

        def settings(url: str) -> Any:
            upstream = {"base_url": url.removesuffix("/v1") + base, "kind": "vertex", **auth}
            return settings_from_dict({"upstreams": {"vertex": upstream}}, "adversarial.yaml", {})

        return await serve_guard(settings, upstream=provider.app()), provider

    return start


def permission_denied(status: int, body: Any) -> bool:
    """A 403 in Google's shape (Vertex AI's or, on an interactions path, the Interactions API's) naming what is refused."""
    error = body["error"]
    named = "project" in error["message"] or "location" in error["message"]
    return status == 403 and error.get("status", error["code"]) in ("PERMISSION_DENIED", "permission_denied") and named


class TestTheProjectTheTokenGoesTo:
    @pytest.mark.parametrize(
        ("method", "path"),
        [
            ("POST", generate("/v1/projects/other-project/locations/us-central1")),
            ("POST", generate("/v1beta1/projects/other-project/locations/europe-west4")),
            ("POST", generate("/v1/projects/my-project/locations/europe-west4")),
            ("GET", "/v1beta1/projects/other-project/locations/us-central1/cachedContents"),
            ("POST", "/v1beta1/projects/other-project/locations/us-central1/interactions"),
        ],
    )
    async def test_a_path_naming_another_project_or_location_is_refused_before_anything_is_sent(
        self, vertex, method, path
    ):
        guard, provider = await vertex(token_command="printf operator-token")
        body = {"model": FLASH, "input": "hi"} if path.endswith("interactions") else BODY
        status, answer = await call(guard.url(path), method, body)
        assert permission_denied(status, answer)
        assert provider.received == []

    @pytest.mark.parametrize(
        ("method", "path"),
        [
            ("POST", generate(OWN)),
            ("POST", generate("/v1beta1/projects/my-project/locations/us-central1")),
            ("GET", "/v1beta1/projects/my-project/locations/us-central1/cachedContents"),
        ],
    )
    async def test_control_the_configured_project_and_location_get_the_operator_s_token(self, vertex, method, path):
        guard, provider = await vertex(token_command="printf operator-token")
        status, _ = await call(guard.url(path), method, BODY if method == "POST" else None)
        assert status == 200 and provider.received[-1].path == path
        assert provider.received[-1].headers["Authorization"] == "Bearer operator-token"

    async def test_a_base_url_naming_no_project_sends_no_path_that_names_one(self, vertex):
        guard, provider = await vertex(base="", token_command="printf operator-token")
        status, answer = await call(guard.url(generate(OWN)), body=BODY)
        assert status == 403 and "base_url" in answer["error"]["message"]
        assert provider.received == []

    async def test_control_express_mode_paths_name_no_project_and_pass(self, vertex):
        guard, provider = await vertex(base="", token_command="printf operator-token")
        status, _ = await call(guard.url(generate("/v1")), body=BODY)
        assert status == 200 and provider.received[-1].path == generate("/v1")


class TestWhatTravelsBesideTheToken:
    async def test_a_client_s_billing_project_and_key_headers_never_travel_beside_the_operator_s_token(self, vertex):
        guard, provider = await vertex(token_command="printf operator-token")
        headers = {"x-goog-user-project": "other-project", "x-goog-api-key": "client-key", "x-goog-api-client": "sdk"}
        status, _ = await call(guard.url(generate(OWN)), body=BODY, headers=headers)
        sent = provider.received[-1].headers
        assert status == 200 and sent["Authorization"] == "Bearer operator-token"
        assert "x-goog-user-project" not in sent and "x-goog-api-key" not in sent
        assert sent["x-goog-api-client"] == "sdk"  # control: a header that is no credential passes

    async def test_control_with_the_client_s_own_credential_its_billing_project_goes_with_it(self, vertex):
        guard, provider = await vertex()
        headers = {"Authorization": "Bearer client-token", "x-goog-user-project": "client-project"}
        status, _ = await call(guard.url(generate(OWN)), body=BODY, headers=headers)
        sent = provider.received[-1].headers
        assert status == 200 and sent["Authorization"] == "Bearer client-token"
        assert sent["x-goog-user-project"] == "client-project"

    async def test_a_client_s_key_parameter_never_travels_beside_an_adc_token(
        self, vertex, monkeypatch: pytest.MonkeyPatch
    ):
        """ADC's token stands in for google-auth's (no metadata server here)."""

        async def token(self: Any) -> str:
            return "adc-token"

        monkeypatch.setattr(adc.AdcTokens, "token", token)
        guard, provider = await vertex(auth="adc")
        status, _ = await call(guard.url(generate(OWN) + "?key=client-key&alt=sse"), body=BODY)
        sent = provider.received[-1]
        assert status == 200 and sent.headers["Authorization"] == "Bearer adc-token"
        assert "key=" not in sent.query and "alt=sse" in sent.query  # control: the rest of the query


class TestVertexsOpenAIEndpoint:
    async def test_control_an_openai_shaped_path_goes_under_the_base_url_in_the_configured_project(self, vertex):
        guard, provider = await vertex(token_command="printf operator-token")
        await call(guard.url("/v1/embeddings"), body={"model": "text-embedding-005", "input": "hi"})
        assert provider.received[-1].path == f"{OWN}/endpoints/openapi/embeddings"
        assert provider.received[-1].headers["Authorization"] == "Bearer operator-token"

    async def test_its_chat_endpoint_is_not_reachable_uncounted_by_a_longer_spelling(self, vertex):
        """With a base at the host's root (express mode), `/v1/v1/projects/.../chat/completions` would land on it."""
        guard, provider = await vertex(base="", api_key_env="VERTEX_KEY")
        path = f"/v1{OWN}/endpoints/openapi/chat/completions"
        status, answer = await call(guard.url(path), body={"model": "google/gemini-2.5-flash", "messages": []})
        assert status == 404 and "generates" in answer["error"]["message"]
        assert provider.received == []
