"""Claude routed as `examples/anthropic.yaml` routes it, and `examples/sdk_anthropic.py` run through it."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from proxy.config.settings import load_settings
from proxy.config.upstreams import UpstreamSettings
from proxy.demo.echo import running_echo

EXAMPLES = Path(__file__).parents[3] / "examples"
ENV = {"ANTHROPIC_API_KEY": "sk-ant-test", "OPENAI_API_KEY": "sk-test"}


class TestTheExampleConfig:
    def test_claude_models_route_to_the_anthropic_kind_with_its_key_and_the_rest_to_openai(self):
        settings = load_settings(EXAMPLES / "anthropic.yaml", ENV)
        claude = next(r for r in settings.routes if r.matches("claude-sonnet-4-6"))
        other = next(r for r in settings.routes if r.matches("gpt-4o"))
        anthropic = settings.upstreams[claude.upstream]
        assert (anthropic.kind, anthropic.api_key_env, anthropic.serves("messages")) == (
            "anthropic",
            "ANTHROPIC_API_KEY",
            True,
        )
        assert settings.upstreams[other.upstream].kind == "openai"

    async def test_the_anthropic_sdk_example_runs_through_it(self, start_proxy: Any):
        """The example's tool loop, stream and count_tokens, with the echo standing in for Anthropic."""
        async with running_echo() as echo_url:
            settings = load_settings(EXAMPLES / "anthropic.yaml", ENV)
            upstreams = dict(settings.upstreams)
            upstreams["anthropic"] = UpstreamSettings(
                name="anthropic", base_url=echo_url, kind="anthropic", api_key_env="ANTHROPIC_API_KEY"
            )
            proxy = await start_proxy(settings.revalidated(upstreams=upstreams))
            env = {**os.environ, "ANTHROPIC_BASE_URL": str(proxy.make_url("")).rstrip("/")}
            env.pop("ANTHROPIC_API_KEY", None)
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                str(EXAMPLES / "sdk_anthropic.py"),
                env=env,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
            out, err = await asyncio.wait_for(process.communicate(), 240)
        assert process.returncode == 0, err.decode()
        text = out.decode()
        assert "input tokens:" in text and "Echo from context-guard's testing upstream" in text
        assert "The conversation is valid." in text


@pytest.fixture(autouse=True)
def _no_network_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
