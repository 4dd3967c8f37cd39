"""Three guard processes behind HAProxy share what they learn through a real redis-server.

The fake upstream's window (6,000 tokens by its own count, a quarter higher than ours) is smaller
than the 8,192 the guard knows for gpt-4, and it answers an over-window request with OpenAI's own
"maximum context length" error. Requests go one at a time, so what the fake received while a
request ran is what that request's replica sent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.components.conftest import Fleet, Outcome, RedisServer, all_ready, call, start_fleet
from tests.server.conftest import long_conversation
from tests.support.processes import Guard

pytestmark = pytest.mark.components

LIMIT = 6000  # the fake provider's window, in its count
DEADLINE_MS = 100  # state.deadline_ms: the longest a request waits on Redis (ample on a busy machine)
RETRY_SECONDS = 0.5  # state.retry_seconds: Redis is left alone this long after a failure
LOCAL_CACHE_SECONDS = 0.2  # state.local_cache_seconds
# What a replica may spend on a request beyond counting, trimming and the upstream: the Redis
# deadline, and parsing and routing on a machine shared with the other processes of the test. A
# paused Redis that were waited on past the deadline would cost its socket timeout (0.5 s).
OVERHEAD_BOUND_MS = DEADLINE_MS + 200


def guard_config(redis_url: str) -> str:
    return (
        "log:\n  format: json\n"
        f"state:\n  url: {redis_url}\n  deadline_ms: {DEADLINE_MS}\n"
        f"  local_cache_seconds: {LOCAL_CACHE_SECONDS}\n  retry_seconds: {RETRY_SECONDS}\n"
    )


@dataclass
class Sent:
    """One request through HAProxy: what its client saw, the replica's log event, the upstream's view."""

    outcome: Outcome
    event: dict[str, Any]
    over_window: list[bool]  # for each request the fake upstream received: was it over its window?

    @property
    def replica(self) -> str:
        assert self.outcome.served_by is not None
        return self.outcome.served_by


@dataclass
class SharedFleet:
    fleet: Fleet
    redis: RedisServer

    async def send(self, model: str) -> Sent:
        before = len(self.fleet.upstream.received)
        body = {"model": model, "messages": long_conversation()}
        async with aiohttp.ClientSession() as session:
            outcome = await call(session, self.fleet.haproxy.url("/v1/chat/completions"), body)
        assert outcome.status == 200, (outcome.status, outcome.error, outcome.body[:500])
        received = self.fleet.upstream.received[before:]
        event = await request_event(self.fleet.guard(outcome.served_by or ""), outcome.request_id)
        return Sent(outcome, event, [self.fleet.upstream.provider_count(r.json()) > LIMIT for r in received])

    async def learn(self, model: str) -> str:
        """One request that teaches a replica `model`'s correction; the replica it went through."""
        sent = await self.send(model)
        assert sent.over_window == [True, False], "rejected once for its size, then retried cut further"
        assert sent.event["self_correction"]["provider_limit"] == LIMIT
        return sent.replica

    async def each_replica_fits_first_time(self, model: str, replicas: set[str]) -> list[Sent]:
        """Requests round the fleet until every one of `replicas` served one; each must fit at once."""
        seen: set[str] = set()
        sent_all: list[Sent] = []
        for _ in range(4 * len(self.fleet.guards)):
            if replicas <= seen:
                break
            sent = await self.send(model)
            assert sent.over_window == [False], f"{sent.replica} sent a request over the window"
            assert sent.event["window_source"] == "correction"
            seen.add(sent.replica)
            sent_all.append(sent)
        assert replicas <= seen, f"HAProxy reached only {seen}"
        return sent_all

    async def restart_all(self) -> None:
        for guard in self.fleet.guards:
            guard.stop(10)
        for guard in self.fleet.guards:
            guard.start()
        await all_ready(self.fleet.guards)
        assert self.redis.clients() == len(self.fleet.guards), "each connects before its first request"
        await self.fleet.served_by_all()


@pytest.fixture
async def shared(tmp_path: Path, redis_server, start_upstream, processes) -> AsyncIterator[SharedFleet]:
    upstream = await start_upstream()
    upstream.limit, upstream.provider_factor, upstream.error_style = LIMIT, 1.25, "openai"
    config = tmp_path / "guard.yaml"
    config.write_text(guard_config(redis_server.url))
    serve = ("--config", str(config), "--drain-delay", "0.2", "--shutdown-grace", "5")
    yield SharedFleet(await start_fleet(tmp_path, upstream, processes, *serve), redis_server)


class TestSharedCorrections:
    async def test_a_correction_learned_through_one_replica_is_applied_by_the_others_and_after_all_restart(
        self, shared
    ):
        learner = await shared.learn("gpt-4")
        others = {g.name for g in shared.fleet.guards} - {learner}
        await shared.each_replica_fits_first_time("gpt-4", others)

        await shared.restart_all()
        await shared.each_replica_fits_first_time("gpt-4", {g.name for g in shared.fleet.guards})


class TestRedisAway:
    async def test_no_request_fails_or_waits_past_the_deadline_and_sharing_resumes_when_it_is_back(self, shared):
        everyone = {g.name for g in shared.fleet.guards}
        await shared.learn("gpt-4")
        await shared.each_replica_fits_first_time("gpt-4", everyone)
        await asyncio.sleep(LOCAL_CACHE_SECONDS + 0.1)  # past the local cache: the next reads ask Redis

        shared.redis.pause()  # accepts connections, answers nothing
        paused = await shared.each_replica_fits_first_time("gpt-4", everyone)
        shared.redis.resume()
        shared.redis.stop(5)  # gone: connections refused
        await asyncio.sleep(RETRY_SECONDS + 0.1)  # past the pause's failures: the next reads ask Redis again
        stopped = await shared.each_replica_fits_first_time("gpt-4", everyone)
        for event in (sent.event for sent in paused + stopped):
            own = event["total_ms"] - event["upstream_ms"] - event["count_ms"] - event["trim_ms"]
            assert own < OVERHEAD_BOUND_MS, event
        for guard in shared.fleet.guards:
            [unavailable] = guard.events("state_store_unavailable")
            assert unavailable["fallback"] == "local state"
            assert await fallbacks(guard.url("/metrics")) > 0

        shared.redis.start()
        shared.redis.until_ready()
        await asyncio.sleep(RETRY_SECONDS + 0.1)  # every replica asks Redis again
        learner = await shared.learn("gpt-4-0613")
        await shared.each_replica_fits_first_time("gpt-4-0613", everyone - {learner})
        assert all(len(g.events("state_store_recovered")) == 1 for g in shared.fleet.guards)


async def request_event(guard: Guard, request_id: str | None, timeout: float = 10) -> dict[str, Any]:
    """The replica's log event for `request_id` (it is written as the response ends, so may trail it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = [e for e in guard.events("request") if e.get("request_id") == request_id]
        if events:
            return events[0]
        await asyncio.sleep(0.05)
    raise AssertionError(f"{guard.name} logged no request {request_id}:\n{guard.output[-2000:]}")


async def fallbacks(metrics_url: str) -> float:
    async with aiohttp.ClientSession() as session, session.get(metrics_url) as r:
        text = await r.text()
    return sum(
        float(line.split()[-1]) for line in text.splitlines() if line.startswith("context_guard_state_fallbacks")
    )
