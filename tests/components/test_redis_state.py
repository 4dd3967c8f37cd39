"""Learned state shared through a real redis-server: two stores stand for two replicas."""

from __future__ import annotations

import asyncio
import time

import pytest

from proxy.state import StateKey, StateOptions
from proxy.state.redis import RedisStore
from tests.components.conftest import RedisServer

pytestmark = pytest.mark.components

KEY = StateKey("correction", "openai", "gpt-4o")
DEADLINE_MS = 50


def store(server: RedisServer, **options: float) -> RedisStore:
    settings = {"deadline_ms": DEADLINE_MS, "local_cache_seconds": 0.2, "retry_seconds": 0.3, **options}
    return RedisStore(StateOptions(url=server.url, **settings))  # type: ignore[arg-type]


async def timed(call: object) -> tuple[object, float]:
    started = time.perf_counter()
    result = await call  # type: ignore[misc]
    return result, time.perf_counter() - started


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

    async def test_a_value_expires_in_redis_with_its_ttl(self, redis_server):
        a, b = store(redis_server), store(redis_server)
        await a.put(KEY, 1, ttl_seconds=0.3)
        await asyncio.sleep(0.5)
        assert await b.get(KEY) is None
        await asyncio.gather(a.close(), b.close())

    async def test_reads_within_the_cache_interval_stay_local(self, redis_server):
        a, b = store(redis_server, local_cache_seconds=5), store(redis_server)
        assert await a.get(KEY) is None  # remembered as a miss for 5 s
        await b.put(KEY, 2, ttl_seconds=60)
        assert await a.get(KEY) is None and a.local_hits == 1 and a.redis_reads == 1
        await asyncio.gather(a.close(), b.close())


class TestOpening:
    async def test_opening_connects_before_the_first_read_which_then_answers_within_the_deadline(self, redis_server):
        a = store(redis_server)
        await a.open()
        assert redis_server.clients() == 1
        _, took = await timed(a.get(KEY))
        assert a.redis_reads == 1 and a.status().errors == 0 and took < DEADLINE_MS / 1000
        await a.close()

    async def test_opening_while_redis_is_down_returns_at_once_and_falls_back_to_local_state(self, redis_server):
        redis_server.stop(5)
        a = store(redis_server)
        _, took = await timed(a.open())
        assert took < 1 and not a.status().shared and a.status().errors == 1
        await a.put(KEY, 3, ttl_seconds=60)
        assert await a.get(KEY) == 3
        await a.close()


class TestRedisAway:
    async def test_a_stopped_redis_never_fails_a_call_and_sharing_resumes_when_it_is_back(self, redis_server):
        a, b = store(redis_server), store(redis_server)
        await a.put(KEY, 1, ttl_seconds=60)
        redis_server.stop(5)
        results = []
        for value in range(2, 12):
            _, put_took = await timed(a.put(KEY, value, ttl_seconds=60))
            got, get_took = await timed(b.get(KEY))
            results.append((got, put_took, get_took))
            await asyncio.sleep(0.05)
        assert all(put < DEADLINE_MS / 1000 * 2 and get < DEADLINE_MS / 1000 * 2 for _, put, get in results)
        assert await a.get(KEY) == 11  # its own learning still applies locally
        assert not a.status().shared and a.status().fallbacks > 0 and a.status().last_error
        redis_server.start()
        redis_server.until_ready()
        await asyncio.sleep(0.4)  # past retry_seconds
        await a.put(KEY, 12, ttl_seconds=60)
        await asyncio.sleep(0.25)  # past b's local cache
        assert await b.get(KEY) == 12 and a.status().shared and b.status().shared
        await asyncio.gather(a.close(), b.close())

    async def test_a_redis_that_stops_answering_costs_a_request_at_most_the_deadline(self, redis_server):
        a = store(redis_server)
        await a.put(KEY, 5, ttl_seconds=60)
        await asyncio.sleep(0.25)  # past the local cache: the next read asks Redis
        redis_server.pause()
        try:
            value, took = await timed(a.get(KEY))
            assert value == 5 and took < DEADLINE_MS / 1000 + 0.05
            assert a.status().errors == 1 and "TimeoutError" in (a.status().last_error or "")
            _, took_again = await timed(a.get(KEY))  # within retry_seconds: Redis is not asked at all
            assert took_again < 0.005
        finally:
            redis_server.resume()
        await a.close()

    async def test_the_first_failure_and_the_recovery_are_each_logged_once(self, redis_server, logs):
        from proxy.logging import get_logger

        a = RedisStore(StateOptions(url=redis_server.url, deadline_ms=DEADLINE_MS, retry_seconds=0.1), log=get_logger())
        redis_server.stop(5)
        for _ in range(3):
            await a.put(KEY, 1, ttl_seconds=60)
            await asyncio.sleep(0.15)
        redis_server.start()
        redis_server.until_ready()
        await asyncio.sleep(0.15)
        await a.put(KEY, 2, ttl_seconds=60)
        assert [e["event"] for e in logs.events() if e["event"].startswith("state_store")] == [
            "state_store_unavailable",
            "state_store_recovered",
        ]
        await a.close()


class TestSharedCorrectionsThroughRedis:
    async def test_a_correction_learned_by_one_replica_applies_on_another_and_after_both_restart(self, redis_server):
        from proxy.core.corrections import Correction
        from proxy.state.shared_corrections import SharedCorrections

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
        from proxy.server.app import create_app
        from proxy.server.lifecycle import reload_config
        from tests.server.conftest import gateway_settings

        (tmp_path / "other").mkdir()
        other = RedisServer(tmp_path / "other")
        other.start()
        try:
            other.until_ready()
            upstream = "http://127.0.0.1:9/v1"  # never called: no request is sent
            proxy = await aiohttp_server(create_app(gateway_settings(upstream, state={"url": redis_server.url})))
            assert redis_server.clients() == 1
            moved = gateway_settings(upstream, state={"url": other.url})
            assert await reload_config(proxy.app, lambda: moved) is True
            assert other.clients() == 1 and redis_server.clients() == 0
        finally:
            other.stop(5)
