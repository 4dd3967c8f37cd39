"""Load and soak on 127.0.0.1: bounded in count and time, and they stop by themselves."""

from __future__ import annotations

import asyncio
import json
import random

import aiohttp

from proxy.server.process.app import DRAIN
from proxy.server.request.gateway import GATEWAY
from tests.server.conftest import gateway_settings, long_conversation

SMALL = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
LONG = {"model": "gpt-4", "messages": long_conversation(60)}


async def test_a_burst_of_mixed_requests_all_succeed_and_are_all_accounted_for(start_proxy, upstream):
    proxy = await start_proxy(gateway_settings(upstream.url))
    bodies = [SMALL, LONG, {**SMALL, "stream": True}, {**LONG, "stream": True}] * 75  # 300 requests
    limit = asyncio.Semaphore(30)

    async def one(session: aiohttp.ClientSession, body: dict) -> int:
        async with limit, session.post(proxy.make_url("/v1/chat/completions"), data=json.dumps(body)) as r:
            await r.read()
            return r.status

    async with aiohttp.ClientSession() as session:
        statuses = await asyncio.wait_for(asyncio.gather(*(one(session, b) for b in bodies)), timeout=120)
    assert statuses == [200] * len(bodies)
    assert len(upstream.received) == len(bodies)
    async with aiohttp.ClientSession() as session, session.get(proxy.make_url("/metrics")) as r:
        metrics = await r.text()
    assert 'context_guard_requests_total{kind="chat",outcome="trimmed",status="2xx"} 150.0' in metrics
    assert 'context_guard_requests_total{kind="chat",outcome="unchanged",status="2xx"} 150.0' in metrics


async def test_a_soak_with_clients_leaving_mid_stream_leaks_no_connections_or_memory(start_proxy, upstream):
    upstream.stream_chunks, upstream.chunk_delay = 20, 0.005
    proxy = await start_proxy(gateway_settings(upstream.url, tokenizers={"cache_entries": 50}))
    gateway = proxy.app[GATEWAY]
    rng = random.Random(3)
    deadline = asyncio.get_running_loop().time() + 4.0  # seconds of continuous traffic, then stop
    done = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal done
        while asyncio.get_running_loop().time() < deadline:
            i = rng.randrange(10_000)
            body = {
                "model": "gpt-4",
                "stream": True,
                "messages": [{"role": "user", "content": f"request {i} " + "word " * 300}],
            }
            response = await session.post(proxy.make_url("/v1/chat/completions"), data=json.dumps(body))
            if rng.random() < 0.3:
                await response.content.readline()
                response.close()  # the client leaves half-way
            else:
                assert response.status == 200 and b"[DONE]" in await response.read()
                response.release()
            done += 1

    async with aiohttp.ClientSession() as session:
        await asyncio.wait_for(asyncio.gather(*(worker(session) for _ in range(8))), timeout=60)
    assert await proxy.app[DRAIN].wait_idle(30)  # every request's handler, cancelled ones too, has finished
    assert done > 50
    connector = gateway.session.connector
    assert connector is not None and len(connector._acquired) == 0  # every upstream connection went back
    assert len(gateway.models.cache) <= 50  # the count cache held to its bound
    async with (
        aiohttp.ClientSession() as session,
        session.post(proxy.make_url("/v1/chat/completions"), data=json.dumps(SMALL)) as r,
    ):
        assert r.status == 200
