"""Learned state shared through a real redis-server: two stores stand for two replicas.

The stores' own intervals (local cache, retry) run on a `ManualClock` the test moves; Redis's own
expiry is checked by the time Redis says a key has left. Nothing is asserted about how long a call took: a call that waited
for Redis past its deadline shows as an error or a Redis read in the store's counters.
"""

from __future__ import annotations

import asyncio

import pytest
import redis

from proxy.state import StateKey, StateOptions
from proxy.state.redis import RedisStore
from tests.components.conftest import RedisServer
from tests.support.clock import ManualClock

pytestmark = pytest.mark.components

KEY = StateKey("correction", "openai", "gpt-4o")
DEADLINE_MS = 50


LOCAL_CACHE_SECONDS, RETRY_SECONDS = 0.2, 0.3


def store(server: RedisServer, clock: ManualClock | None = None, **options: float) -> RedisStore:
    settings = {
        "deadline_ms": DEADLINE_MS,
        "local_cache_seconds": LOCAL_CACHE_SECONDS,
        "retry_seconds": RETRY_SECONDS,
        **options,
    }
    return RedisStore(StateOptions(url=server.url, **settings), clock=clock or ManualClock())  # type: ignore[arg-type]


class TestSharing:
    async def test_a_value_put_by_one_replica_is_read_by_another(self, redis_server):
        a, b = store(redis_server), store(redis_server)
        await a.put(KEY, {"window": 7800}, ttl_seconds=60)
        assert await b.get(KEY) == {"window": 7800}
        assert a.redis_writes == 1 and b.redis_reads == 1
        await asyncio.gather(a.close(), b.close())

    async def test_a_value_outlives_the_replicas_that_wrote_it(self, redis_server):
        first = store(redis_server)
        await first.put(KEY, 0.93, ttl_seconds=60)
        await first.close()
        second = store(redis_server)
        assert await second.get(KEY) == 0.93
        await second.close()

    async def test_a_value_is_written_to_redis_with_its_ttl(self, redis_server):
        """Redis expires it, for every replica: the time it has left is the TTL given (read with
        PTTL, so no wait for the expiry itself)."""
        a = store(redis_server)
        await a.put(KEY, 1, ttl_seconds=30)
        left_ms = redis.Redis.from_url(redis_server.url).pttl(KEY.render(a.options.namespace))
        assert 25_000 < left_ms <= 30_000
        await a.close()

    async def test_reads_within_the_cache_interval_stay_local(self, redis_server):
        a, b = store(redis_server, local_cache_seconds=5), store(redis_server)
        assert await a.get(KEY) is None  # remembered as a miss for 5 s
        await b.put(KEY, 2, ttl_seconds=60)
        assert await a.get(KEY) is None and a.local_hits == 1 and a.redis_reads == 1
        await asyncio.gather(a.close(), b.close())


class TestOpening:
    async def test_opening_connects_before_the_first_read_which_then_answers_within_the_deadline(self, redis_server):
        """Within the deadline: a read past it would be an error and a fallback."""
        a = store(redis_server)
        await a.open()
        assert redis_server.clients() == 1
        await a.get(KEY)
        assert a.redis_reads == 1 and a.status().errors == 0 and a.fallbacks == 0
        await a.close()

    async def test_opening_while_redis_is_down_returns_at_once_and_falls_back_to_local_state(self, redis_server):
        """At once: the refused connection ends it, not the opening's deadline running out."""
        redis_server.stop(5)
        a = store(redis_server)
        await a.open()
        assert not a.status().shared and a.status().errors == 1
        assert "ConnectionError" in (a.status().last_error or "") and "TimeoutError" not in (a.status().last_error or "")
        await a.put(KEY, 3, ttl_seconds=60)
        assert await a.get(KEY) == 3
        await a.close()


class TestRedisAway:
    async def test_a_stopped_redis_never_fails_a_call_and_sharing_resumes_when_it_is_back(self, redis_server):
        clock = ManualClock()
        a, b = store(redis_server, clock), store(redis_server, clock)
        await a.put(KEY, 1, ttl_seconds=60)
        redis_server.stop(5)
        clock.advance(LOCAL_CACHE_SECONDS + 0.1)  # past b's local cache: its next read asks Redis
        results = []
        for value in range(2, 12):
            await a.put(KEY, value, ttl_seconds=60)
            results.append(await b.get(KEY))
        assert results == [None] * 10  # b never learned the value: nothing failed, nothing was shared
        # Each store asked the stopped Redis once, then not again within retry_seconds.
        assert a.status().errors == b.status().errors == 1 and a.fallbacks == b.fallbacks == 10
        assert await a.get(KEY) == 11  # its own learning still applies locally
        assert not a.status().shared and a.status().last_error
        redis_server.start()
        redis_server.until_ready()
        clock.advance(RETRY_SECONDS + 0.01)  # past retry_seconds
        await a.put(KEY, 12, ttl_seconds=60)
        clock.advance(LOCAL_CACHE_SECONDS)  # past b's local cache
        assert await b.get(KEY) == 12 and a.status().shared and b.status().shared
        await asyncio.gather(a.close(), b.close())

    async def test_a_redis_that_stops_answering_costs_a_request_at_most_the_deadline(self, redis_server):
        clock = ManualClock()
        a = store(redis_server, clock)
        await a.put(KEY, 5, ttl_seconds=60)
        clock.advance(LOCAL_CACHE_SECONDS + 0.1)  # past the local cache: the next read asks Redis
        redis_server.pause()
        try:
            assert await a.get(KEY) == 5
            # The deadline's timer ended the call (an empty TimeoutError), not the socket's longer
            # timeout (redis-py's TimeoutError, which says so), nor Redis answering.
            assert a.status().errors == 1 and a.status().last_error == "TimeoutError" and a.redis_reads == 0
            assert await a.get(KEY) == 5  # within retry_seconds: Redis is not asked at all
            assert a.status().errors == 1 and a.fallbacks == 2 and a.redis_reads == 0
        finally:
            redis_server.resume()
        await a.close()

    async def test_the_first_failure_and_the_recovery_are_each_logged_once(self, redis_server, logs):
        from proxy.logging import get_logger

        clock = ManualClock()
        options = StateOptions(url=redis_server.url, deadline_ms=DEADLINE_MS, retry_seconds=0.1)
        a = RedisStore(options, log=get_logger(), clock=clock)
        redis_server.stop(5)
        for _ in range(3):  # each past retry_seconds: Redis is asked and fails three times
            await a.put(KEY, 1, ttl_seconds=60)
            clock.advance(0.15)
        assert a.status().errors == 3
        redis_server.start()
        redis_server.until_ready()
        await a.put(KEY, 2, ttl_seconds=60)
        assert [e["event"] for e in logs.events() if e["event"].startswith("state_store")] == [
            "state_store_unavailable",
            "state_store_recovered",
        ]
        await a.close()


class TestSharedCorrectionsThroughRedis:
    async def test_a_correction_learned_by_one_replica_applies_on_another_and_after_both_restart(self, redis_server):
        from proxy.core.learning.corrections import Correction
        from proxy.state.store import SharedCorrections

        learned = Correction(window=7000, factor=1.2, provider="openai")
        a, b = store(redis_server), store(redis_server)
        await SharedCorrections(a, 60).remember("openai", "gpt-4o", learned)
        assert await SharedCorrections(b, 60).get("openai", "gpt-4o") == learned
        await asyncio.gather(a.close(), b.close())
        restarted = store(redis_server)
        assert await SharedCorrections(restarted, 60).get("openai", "gpt-4o") == learned
        await restarted.close()


class TestTheProxysStore:
    async def test_is_connected_as_the_proxy_starts_and_a_reload_to_another_redis_connects_before_it_serves(
        self, redis_server, tmp_path, aiohttp_server
    ):
        from proxy.server.process.app import create_app
        from proxy.server.process.lifecycle import reload_config
        from tests.server.conftest import gateway_settings

        (tmp_path / "other").mkdir()
        other = RedisServer.started(tmp_path / "other")
        try:
            upstream = "http://127.0.0.1:9/v1"  # never called: no request is sent
            proxy = await aiohttp_server(create_app(gateway_settings(upstream, state={"url": redis_server.url})))
            assert redis_server.clients() == 1
            moved = gateway_settings(upstream, state={"url": other.url})
            assert await reload_config(proxy.app, lambda: moved) is True
            assert other.clients() == 1 and redis_server.clients() == 0
        finally:
            other.stop(5)
