"""No cross-client timing oracle: counts are cached per client.

A count the cache holds answers much faster than a count: with one cache for everyone, a client
could time whether another had sent a text. Counts are kept per client (its credential, else its
connection) unless the operator opts in to one shared cache. Work is asserted by the cache's own
hit count, not by the clock.
"""

# ruff: noqa: F811  # fixtures imported from tests/server/conftest.py, named again as parameters

from __future__ import annotations

from typing import Any

import aiohttp

from proxy.server.request.gateway import GATEWAY
from tests.server.conftest import gateway_settings, logs, start_proxy, upstream  # noqa: F401  # fixtures

SECRET = "The merger with Initech closes on March 3rd at 41 dollars a share. " * 6000  # about 400 KB


async def send(proxy: Any, key: str, text: str) -> int:
    """The cache hits one request of the client holding `key` made."""
    cache = proxy.app[GATEWAY].models.cache
    before = cache.hits
    body = {"model": "gpt-4o", "messages": [{"role": "user", "content": text}]}
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
        async with session.post(proxy.make_url("/v1/chat/completions"), json=body) as r:
            assert r.status == 200
    return cache.hits - before


class TestTheCountCache:
    async def test_never_answers_one_client_with_what_another_sent(self, start_proxy, upstream):
        proxy = await start_proxy(gateway_settings(upstream.url))
        assert await send(proxy, "victim", SECRET) == 0
        assert await send(proxy, "attacker", SECRET) == 0  # counted afresh: as long as a text never sent
        assert await send(proxy, "victim", SECRET) > 0  # a client's own re-sent conversation stays cheap

    async def test_without_a_credential_is_kept_per_connection(self, start_proxy, upstream):
        proxy = await start_proxy(gateway_settings(upstream.url))
        body = {"model": "gpt-4o", "messages": [{"role": "user", "content": SECRET}]}
        cache = proxy.app[GATEWAY].models.cache
        async with aiohttp.ClientSession() as first:
            for _ in range(2):
                async with first.post(proxy.make_url("/v1/chat/completions"), json=body) as r:
                    assert r.status == 200
            hits = cache.hits
            assert hits > 0  # the second request on the same connection
            async with aiohttp.ClientSession() as other, other.post(proxy.make_url("/v1/chat/completions"), json=body):
                pass
            assert cache.hits == hits

    async def test_can_be_shared_by_an_operator_who_opts_in(self, start_proxy, upstream):
        proxy = await start_proxy(gateway_settings(upstream.url, tokenizers={"share_count_cache": True}))
        assert await send(proxy, "team-a", SECRET) == 0
        assert await send(proxy, "team-b", SECRET) > 0
