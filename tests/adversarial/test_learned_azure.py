"""On Azure deployment paths the path names the model.

Azure serves the deployment the path names and ignores the body's `model`. A client that sends
`"model": "big"` to `deployments/small` must not teach the window of `small` to `big`: the guard
budgets, routes and learns by the deployment.
"""

# ruff: noqa: F811  # fixtures imported from tests/server/conftest.py, named again as parameters

from __future__ import annotations

import json
from typing import Any

import aiohttp
from aiohttp import web

from tests.server.conftest import gateway_settings, logs, long_conversation, start_proxy  # noqa: F401  # fixtures
from tests.support.upstream import FakeUpstream

WINDOWS = {"small": 4800, "big": 100_000}  # what each deployment really runs with


class FakeAzure(FakeUpstream):
    """Serves each deployment with its own window, whatever model the body names."""

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/openai/deployments/{deployment}/chat/completions", self.deployment)
        return app

    async def deployment(self, request: web.Request) -> web.StreamResponse:
        self.limit = WINDOWS[request.match_info["deployment"]]
        return await self.chat(request)


async def chat(proxy: Any, deployment: str, body: dict[str, Any]) -> tuple[int, dict[str, str]]:
    path = f"/openai/deployments/{deployment}/chat/completions?api-version=2024-10-21"
    async with aiohttp.ClientSession() as session:
        async with session.post(proxy.make_url(path), data=json.dumps(body), headers={"api-key": "k"}) as r:
            await r.read()
            return r.status, dict(r.headers)


class TestAnAzureDeploymentPath:
    async def test_a_body_naming_another_model_teaches_that_model_nothing(self, aiohttp_server, start_proxy, logs):
        fake = FakeAzure(provider_factor=1.0)
        url = str((await aiohttp_server(fake.app())).make_url(""))
        overrides = [{"match": name, "context_window": 100_000} for name in WINDOWS]
        proxy = await start_proxy(gateway_settings(url, models={"overrides": overrides}))

        status, _ = await chat(proxy, "small", {"model": "big", "messages": long_conversation(40)})
        assert status == 200
        attack = logs.events("request")[0]
        assert attack["model"] == "small" and attack["self_correction"]["provider_limit"] == 4800

        long_chat = long_conversation(160)  # about 29,000 tokens: fits big's 100,000
        status, headers = await chat(proxy, "big", {"model": "big", "messages": long_chat})
        honest = logs.events("request")[-1]
        assert status == 200 and honest["outcome"] == "unchanged" and "applied_correction" not in honest
        assert honest["tokens_before"] > 25_000 and int(headers["x-context-guard-removed"]) == 0
        assert fake.received[-1].json()["messages"] == long_chat

    async def test_the_deployment_keys_the_budget_whatever_the_body_says(self, aiohttp_server, start_proxy, logs):
        fake = FakeAzure(provider_factor=1.0)
        url = str((await aiohttp_server(fake.app())).make_url(""))
        overrides = [{"match": "small", "context_window": 4800}, {"match": "big", "context_window": 100_000}]
        proxy = await start_proxy(gateway_settings(url, models={"overrides": overrides}))
        status, headers = await chat(proxy, "small", {"model": "big", "messages": long_conversation(40)})
        assert status == 200 and int(headers["x-context-guard-budget"]) < 4800
        assert logs.events("request")[-1]["override"] == "small"
