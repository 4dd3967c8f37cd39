"""The ledger of what the provider holds, shared by two replicas through a real redis-server: a
Responses chain one replica relayed is counted by the other from the ledger, never by asking the
provider, and within the band of the provider's own count."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from proxy.config.settings import settings_from_dict
from proxy.server.backends.models import Models
from proxy.server.process.app import create_app
from tests.components.conftest import RedisServer
from tests.support.upstream import FakeUpstream

pytestmark = pytest.mark.components

MODEL = "gpt-4o"


async def replica(aiohttp_server: Any, model_map: Any, provider: FakeUpstream, redis_url: str) -> openai.AsyncOpenAI:
    upstream = {"base_url": provider.url, "kind": "openai", "read_timeout": 10, "connect_timeout": 2}
    data = {"upstreams": {"openai": upstream}, "state": {"url": redis_url, "deadline_ms": 500}}
    settings = settings_from_dict(data, "replica.yaml", {})
    server = await aiohttp_server(create_app(settings, Models(settings, model_map)))
    return openai.AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key="sk-client", max_retries=0)


class TestTwoReplicasOnRedis:
    async def test_a_chain_relayed_by_one_is_counted_from_the_ledger_by_the_other(
        self, aiohttp_server, model_map, redis_server: RedisServer
    ):
        provider = FakeUpstream(every_shape=True)
        provider.url = str((await aiohttp_server(provider.app())).make_url("/v1"))
        one = await replica(aiohttp_server, model_map, provider, redis_server.url)
        two = await replica(aiohttp_server, model_map, provider, redis_server.url)
        first = await one.responses.create(model=MODEL, input="word " * 2_000, max_output_tokens=100)
        raw = await two.responses.with_raw_response.create(
            model=MODEL, input="and then?", max_output_tokens=100, previous_response_id=first.id
        )
        assert raw.headers["x-context-guard-held"] == "ledger"
        counted, provider_count = int(raw.headers["x-context-guard-tokens-before"]), provider.stored.counted[-1]
        assert provider_count * 0.98 <= counted <= provider_count * 1.3
        assert not any(r.path.endswith("/responses/input_tokens") for r in provider.received)
