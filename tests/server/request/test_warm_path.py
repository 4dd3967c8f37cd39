"""The warm path: a conversation re-sent with one new turn costs only its new messages."""

from __future__ import annotations

import aiohttp
import orjson

from proxy.apis.base import Origin
from proxy.apis.openai import chat
from proxy.core.counting.count_cache import sizes_to_keep
from proxy.server.request.gateway import GATEWAY
from tests.server.conftest import gateway_settings, long_conversation

JSON = {"Content-Type": "application/json"}


class TestWarmCounts:
    async def test_a_resent_conversation_is_counted_from_the_cache_but_for_its_new_turn(self, start_proxy, upstream):
        proxy = await start_proxy(gateway_settings(upstream.url))
        cache = proxy.app[GATEWAY].models.cache
        messages = long_conversation(turns=20)
        url = str(proxy.make_url("/v1/chat/completions"))
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json={"model": "gpt-4o", "messages": messages}) as first:
                assert first.status == 200 and first.headers["x-context-guard-removed"] == "0"
            counted_once, hits_before = cache.misses, cache.hits
            resent = [*messages, {"role": "assistant", "content": "Noted."}, {"role": "user", "content": "And?"}]
            async with session.post(url, json={"model": "gpt-4o", "messages": resent}) as second:
                assert second.status == 200
        # The shared turns come from the cache (as one opening); only the two new messages are
        # counted (too short to cache their texts), and this request's openings kept for the next.
        assert cache.hits > hits_before
        assert cache.misses - counted_once <= 2 + len(sizes_to_keep(len(resent)))


class TestMessageSources:
    def test_view_message_i_comes_from_messages_i(self):
        assert [s.origins for s in chat.message_sources(3)] == [(Origin("messages", i),) for i in range(3)]

    def test_counts_past_the_kept_prefix_are_whole(self):
        sources = chat.message_sources(chat._SOURCES_KEPT + 2)
        assert len(sources) == chat._SOURCES_KEPT + 2
        assert sources[-1].origins == (Origin("messages", chat._SOURCES_KEPT + 1),)
        assert chat.message_sources(0) == ()


class TestResentBodies:
    """A conversation re-sent with new turns is parsed and checked only where it is new, and
    refused exactly where a body read whole would be."""

    async def resend(self, start_proxy, upstream, tail: bytes) -> tuple[int, dict]:
        proxy = await start_proxy(gateway_settings(upstream.url))
        url = str(proxy.make_url("/v1/chat/completions"))
        first = orjson.dumps({"model": "gpt-4o", "messages": long_conversation(turns=10)})
        async with aiohttp.ClientSession() as session:
            async with session.post(url, data=first, headers=JSON) as response:
                assert response.status == 200
            async with session.post(url, data=first[: first.rindex(b"]")] + tail, headers=JSON) as response:
                return response.status, await response.json()

    async def test_a_new_message_of_the_wrong_shape_is_refused_naming_it(self, start_proxy, upstream):
        status, answer = await self.resend(start_proxy, upstream, b',{"role":"user","content":5}]}')
        assert status == 400
        assert answer["error"]["param"] == f"messages[{len(long_conversation(turns=10))}].content"

    async def test_a_new_message_with_a_key_twice_is_refused_naming_the_key(self, start_proxy, upstream):
        status, answer = await self.resend(start_proxy, upstream, b',{"role":"user","content":"a","content":"b"}]}')
        assert status == 400
        assert answer["error"]["param"] == "content" and "twice" in answer["error"]["message"]

    async def test_a_top_level_key_written_again_after_the_messages_is_refused(self, start_proxy, upstream):
        status, answer = await self.resend(start_proxy, upstream, b'],"model":"gpt-4o-mini"}')
        assert status == 400
        assert answer["error"]["param"] == "model"

    async def test_a_valid_follow_up_is_forwarded_as_it_came(self, start_proxy, upstream):
        tail = b',{"role":"assistant","content":"Noted."},{"role":"user","content":"And?"}],"stream":false}'
        status, _ = await self.resend(start_proxy, upstream, tail)
        assert status == 200
        assert upstream.received[-1].json()["messages"][-1] == {"role": "user", "content": "And?"}


class TestWhereLargeBodiesAreRead:
    """Bodies whose new part is large are read and counted off the event loop; a large
    conversation re-sent with a short turn is small work, done on the loop."""

    async def offloaded(self, start_proxy, upstream, monkeypatch, second: list[dict]) -> list[str]:
        from proxy.server.threads import placement

        calls: list[str] = []
        real = placement.off_loop

        async def spy(work, *args, **kwargs):
            calls.append(getattr(work, "__name__", repr(work)))
            return await real(work, *args, **kwargs)

        monkeypatch.setattr(placement, "off_loop", spy)
        proxy = await start_proxy(gateway_settings(upstream.url, server={"offload_bytes": 8192}))
        url = str(proxy.make_url("/v1/chat/completions"))
        first = long_conversation(turns=20)
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json={"model": "gpt-4o", "messages": first}) as response:
                assert response.status == 200
            calls.clear()
            async with session.post(url, json={"model": "gpt-4o", "messages": [*first, *second]}) as response:
                assert response.status == 200
        return calls

    async def test_a_large_conversation_re_sent_with_a_short_turn_is_read_on_the_loop(
        self, start_proxy, upstream, monkeypatch
    ):
        assert await self.offloaded(start_proxy, upstream, monkeypatch, [{"role": "user", "content": "And?"}]) == []

    async def test_a_re_sent_conversation_with_a_large_new_turn_is_read_off_the_loop(
        self, start_proxy, upstream, monkeypatch
    ):
        long_turn = [{"role": "user", "content": "why " * 5000}]
        assert await self.offloaded(start_proxy, upstream, monkeypatch, long_turn) == ["parsed_request", "plan"]
