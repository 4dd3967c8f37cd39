"""Three proxy processes behind a real HAProxy, in front of a fake upstream: restarts lose nothing.

HAProxy checks `/readyz` every 250 ms and takes a replica out after one failed check, as a
Kubernetes Service or any load balancer with health checks would.
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest

from tests.components.conftest import CHAT, Fleet, Outcome, call, start_fleet, start_guard

pytestmark = pytest.mark.components

DRAIN_DELAY = 2.0
TIMINGS = ("--drain-delay", str(DRAIN_DELAY), "--shutdown-grace", "30")


def is_down(fleet: Fleet, name: str) -> bool:
    """HAProxy has logged that it took replica `name` out of the pool."""
    return f"guards/{name} is DOWN" in fleet.haproxy.output


async def until(condition: Callable[[], bool], timeout: float = 30) -> None:
    """A poll of the fleet's state, `timeout` seconds at most."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


@pytest.fixture
async def fleet(tmp_path, start_upstream, processes) -> AsyncIterator[Fleet]:
    yield await start_fleet(tmp_path, await start_upstream(), processes, *TIMINGS)


async def test_sigterm_on_one_replica_loses_none_of_50_streams_and_it_gets_no_new_requests(fleet):
    fleet.upstream.chunk_delay, fleet.upstream.stream_chunks = 0.1, 30  # streams that outlast the drain's start
    url = fleet.haproxy.url("/v1/chat/completions")
    a = fleet.guard("a")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        streams = [asyncio.create_task(call(session, url, {**CHAT, "stream": True})) for _ in range(50)]
        await until(lambda: sum(1 for r in fleet.upstream.received if r.method == "POST" and r.json().get("stream")) >= 50)
        a.signal(signal.SIGTERM)
        later: list[tuple[bool, Outcome]] = []  # (HAProxy had taken `a` out when the request was sent, its outcome)
        while a.popen is not None and a.popen.poll() is None and len(later) < 400:  # requests while `a` drains
            taken_out = is_down(fleet, "a")
            later.append((taken_out, await call(session, url, CHAT)))
            await asyncio.sleep(0.05)  # the pace of a client's requests, not an ordering
        results = await asyncio.gather(*streams)
    assert [r.error for r in results if r.error] == []
    assert all(r.status == 200 and r.body.count("part") == 30 and r.body.endswith("[DONE]\n\n") for r in results)
    assert {r.served_by for r in results} == {"a", "b", "c"}
    assert all(r.status == 200 for _, r in later), [(r.status, r.error) for _, r in later if r.status != 200]
    # Once its readiness check failed and HAProxy took it out, it is sent nothing new.
    after = [r for taken_out, r in later if taken_out]
    assert after and all(r.served_by != "a" for r in after), [r.served_by for r in after]
    assert await a.exited(40) == 0
    [stopped] = a.events("stopped")
    assert stopped["in_flight_at_close"] >= 1 and stopped["cancelled"] == 0
    assert stopped["completed_after_close"] == stopped["in_flight_at_close"]


async def test_sigkill_on_one_replica_fails_only_what_it_had_in_flight_and_it_comes_back(fleet, tmp_path, processes):
    fleet.upstream.delay = 0.3
    url = fleet.haproxy.url("/v1/chat/completions")
    b = fleet.guard("b")
    outcomes: list[tuple[int, bool, Outcome]] = []  # (request, HAProxy had taken `b` out when it was sent, outcome)
    in_flight: set[int] = set()
    numbers = itertools.count()
    enough = asyncio.Event()
    clients = 4

    async def client(session: aiohttp.ClientSession) -> None:
        while not enough.is_set():
            number, taken_out = next(numbers), is_down(fleet, "b")
            in_flight.add(number)
            outcome = await call(session, url, CHAT)
            in_flight.discard(number)
            outcomes.append((number, taken_out, outcome))

    async with aiohttp.ClientSession() as session:
        load = [asyncio.create_task(client(session)) for _ in range(clients)]
        await until(lambda: sum(1 for _, _, o in outcomes if o.served_by == "b") >= 3)  # b is serving
        b.signal(signal.SIGKILL)
        at_kill = set(in_flight)
        await until(lambda: is_down(fleet, "b"))
        await until(lambda: sum(1 for _, taken_out, _ in outcomes if taken_out) >= 12)
        enough.set()
        await asyncio.gather(*load)
    failed = [number for number, _, o in outcomes if o.status != 200]
    assert len(failed) <= clients and set(failed) <= at_kill  # only what it had in flight
    after = [o for _, taken_out, o in outcomes if taken_out]
    assert after and all(o.status == 200 and o.served_by != "b" for o in after)

    back = start_guard("b", b.port, tmp_path, fleet.upstream, processes, *TIMINGS)
    await back.until_ready()
    await fleet.served_by_all()
