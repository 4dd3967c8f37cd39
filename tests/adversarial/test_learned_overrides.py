"""Overrides match the normalised name the model map uses.

With an override capping `gpt-4o` at 16,000 tokens, a client must not get gpt-4o's full 128,000
by spelling the name differently; an override for one dated version holds no other.
"""

# ruff: noqa: F811  # fixtures imported from tests/server/conftest.py, named again as parameters

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from proxy.core.models.model_registry import ModelOverride, ModelRegistry
from tests.server.conftest import gateway_settings, logs, start_proxy, upstream  # noqa: F401  # fixtures

HI = [{"role": "user", "content": "hi"}]


async def budget_for(proxy: Any, model: str) -> int:
    async with aiohttp.ClientSession() as session:
        async with session.post(proxy.make_url("/v1/chat/completions"), json={"model": model, "messages": HI}) as r:
            assert r.status == 200
            return int(r.headers["x-context-guard-budget"])


class TestAnOverride:
    @pytest.mark.parametrize(
        "spelling",
        ["gpt-4o", "gpt-4o-2024-08-06", "openai/gpt-4o", "gpt-4o ", "GPT-4o", "ft:gpt-4o-2024-08-06:acme::abc"],
    )
    async def test_holds_every_spelling_of_its_model(self, start_proxy, upstream, logs, spelling):
        overrides = [{"match": "gpt-4o", "context_window": 16_000}]
        proxy = await start_proxy(gateway_settings(upstream.url, models={"overrides": overrides}))
        assert await budget_for(proxy, spelling) < 16_000
        assert logs.events("request")[-1]["override"] == "gpt-4o"

    async def test_for_a_dated_version_holds_no_other_version(self, start_proxy, upstream, logs):
        overrides = [{"match": "gpt-4o-2024-08-06", "context_window": 16_000}]
        proxy = await start_proxy(gateway_settings(upstream.url, models={"overrides": overrides}))
        assert await budget_for(proxy, "gpt-4o-2024-08-06") < 16_000
        assert await budget_for(proxy, "gpt-4o-2024-11-20") > 100_000
        assert await budget_for(proxy, "gpt-4o") > 100_000
        assert "override" not in logs.events("request")[-1]

    def test_for_a_model_holds_no_other_model_of_its_family(self, model_map):
        registry = ModelRegistry(model_map, overrides=(ModelOverride("gpt-4o", context_window=16_000),))
        assert registry.override_for("gpt-4o-mini") is None
        assert registry.override_for("gpt-4o-mini-2024-07-18") is None
        assert registry.profile("gpt-4o-mini").context_window > 100_000

    def test_for_the_name_as_written_wins_over_one_for_the_undated_name(self, model_map):
        undated, dated = ModelOverride("gpt-4o", context_window=16_000), ModelOverride("gpt-4o-2024-08-06", 30_000)
        registry = ModelRegistry(model_map, overrides=(undated, dated))
        assert registry.profile("gpt-4o-2024-08-06").context_window == 30_000
