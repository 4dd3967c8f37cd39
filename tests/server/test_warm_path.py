"""The warm path: a conversation re-sent with one new turn costs only its new messages."""

from __future__ import annotations

import aiohttp

from proxy.apis import chat
from proxy.apis.base import Origin
from proxy.server.gateway import GATEWAY
from tests.server.conftest import gateway_settings, long_conversation


class TestWarmCounts:
    async def test_a_resent_conversation_is_counted_from_the_cache_but_for_its_new_turn(self, start_proxy, upstream):
        proxy = await start_proxy(gateway_settings(upstream.url))
        cache = proxy.app[GATEWAY].guard.cache
        messages = long_conversation(turns=20)
        url = str(proxy.make_url("/v1/chat/completions"))
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json={"model": "gpt-4o", "messages": messages}) as first:
                assert first.status == 200 and first.headers["x-context-guard-removed"] == "0"
            counted_once, hits_before = cache.misses, cache.hits
            resent = [*messages, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "And?"}]
            async with session.post(url, json={"model": "gpt-4o", "messages": resent}) as second:
                assert second.status == 200
        assert cache.hits - hits_before >= len(messages)
        assert cache.misses - counted_once <= 2  # the two new messages (too short to cache their texts)


class TestMessageSources:
    def test_view_message_i_comes_from_messages_i(self):
        assert [s.origins for s in chat.message_sources(3)] == [(Origin("messages", i),) for i in range(3)]

    def test_counts_past_the_kept_prefix_are_whole(self):
        sources = chat.message_sources(chat._SOURCES_KEPT + 2)
        assert len(sources) == chat._SOURCES_KEPT + 2
        assert sources[-1].origins == (Origin("messages", chat._SOURCES_KEPT + 1),)
        assert chat.message_sources(0) == ()
