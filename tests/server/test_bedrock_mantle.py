"""Bedrock Mantle (`https://bedrock-mantle.{region}.api.aws/anthropic/v1`: Anthropic Messages with a
Bedrock API key as `x-api-key`) is an upstream of `kind: anthropic`: the anthropic SDK through the
guard is trimmed and answered, with the guard's key sent in place of the client's."""

from __future__ import annotations

from typing import Any

import anthropic
import pytest

from proxy.config.settings import settings_from_dict
from proxy.server.backends.models import Models
from proxy.server.process.app import create_app
from tests.support.bedrock_upstream import FakeBedrock, prompt_tokens

CLAUDE = "claude-sonnet-4-5-20250929"


class TestMantle:
    async def test_the_anthropic_sdk_through_a_mantle_upstream_is_trimmed_and_answered(
        self, aiohttp_server: Any, model_map: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("BEDROCK_API_KEY", "guard-mantle-key")
        fake = FakeBedrock(api_key="guard-mantle-key")
        fake_url = str((await aiohttp_server(fake.app())).make_url("")).rstrip("/")
        data = {
            "upstreams": {"mantle": {"kind": "anthropic", "base_url": f"{fake_url}/anthropic/v1",
                                     "api_key_env": "BEDROCK_API_KEY"}},
            "routes": [{"match": "claude-*", "upstream": "mantle"}],
            "models": {"overrides": [{"match": CLAUDE, "context_window": 16_000}]},
        }  # fmt: skip
        settings = settings_from_dict(data, "test.yaml", {})
        guard = await aiohttp_server(create_app(settings, Models(settings, model_map)))
        client = anthropic.AsyncAnthropic(base_url=str(guard.make_url("")), api_key="sk-the-clients-own", max_retries=0)
        history = [{"role": r, "content": " ".join([f"w{k}"] * 1500)} for k, r in enumerate(["user", "assistant"] * 12)]
        answer = await client.messages.create(
            model=CLAUDE, max_tokens=256, system="Be brief.", messages=[*history, {"role": "user", "content": "latest"}]
        )
        sent = fake.last("mantle")
        assert answer.content[0].text == "Done." and sent.raw_path == "/anthropic/v1/messages"  # type: ignore[union-attr]
        assert sent.headers["x-api-key"] == "guard-mantle-key" and "sk-the-clients-own" not in str(sent.headers)
        assert prompt_tokens(history) > fake.window >= prompt_tokens(sent.json())
        assert (
            sent.json()["messages"][-1] == {"role": "user", "content": "latest"}
            and sent.json()["system"] == "Be brief."
        )
