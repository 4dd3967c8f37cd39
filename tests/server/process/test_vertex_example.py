"""examples/vertex-ai.yaml serves Claude on Vertex AI as the anthropic SDK's AnthropicVertex calls it:
a `:rawPredict` path, counted as Messages, sent to the Vertex host under the path as written,
signed with the operator's Application Default Credentials (here a stand-in for google-auth)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import aiohttp

from proxy.config.settings import load_settings
from proxy.server.edge import credentials

EXAMPLE = Path(__file__).parents[3] / "examples" / "vertex-ai.yaml"
CLAUDE = "/v1/projects/my-project/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5@20250929"


class StandInAdc:
    """Google's Application Default Credentials as the guard asks for them: one token, and the
    project they belong to (the one project a path may name beside them)."""

    project = "my-project"

    async def token(self) -> str:
        return "operator-adc-token"


class TestClaudeOnVertex:
    async def test_a_raw_predict_call_is_counted_and_sent_to_the_vertex_host_with_the_operators_token(
        self, start_proxy, upstream, monkeypatch
    ):
        monkeypatch.setattr(credentials, "AdcTokens", StandInAdc)
        settings = load_settings(EXAMPLE, {"VERTEX_PROJECT": "my-project", "VERTEX_LOCATION": "us-east5"})
        claude = settings.upstreams["vertex-claude"]
        assert claude.auth == "adc" and claude.base_url == "https://us-east5-aiplatform.googleapis.com/v1"
        settings = settings.revalidated(
            upstreams={**settings.upstreams, "vertex-claude": dataclasses.replace(claude, base_url=upstream.url)}
        )
        proxy = await start_proxy(settings)
        body = {
            "anthropic_version": "vertex-2023-10-16",
            "max_tokens": 64,
            "messages": [{"role": "user", "content": "Hello from AnthropicVertex"}],
        }
        headers = {"Authorization": "Bearer the-clients-own-google-token", "Content-Type": "application/json"}
        async with (
            aiohttp.ClientSession() as session,
            session.post(proxy.make_url(f"{CLAUDE}:rawPredict"), data=json.dumps(body), headers=headers) as r,
        ):
            assert r.status == 200, await r.text()
            assert r.headers["x-context-guard-tokens-before"].isdigit()
        sent = upstream.received[-1]
        assert sent.path == f"{CLAUDE}:rawPredict"
        assert sent.headers["Authorization"] == "Bearer operator-adc-token"
        assert sent.json()["messages"] == body["messages"] and "model" not in sent.json()
