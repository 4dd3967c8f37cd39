"""Three proxy processes behind a real HAProxy, in front of a fake upstream: restarts lose nothing.

HAProxy checks `/readyz` every 250 ms and takes a replica out after one failed check, as a
Kubernetes Service or any load balancer with health checks would.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from tests.components.conftest import HAProxy, all_ready
from tests.processes import Guard, Process, free_port
from tests.server.fake_upstream import FakeUpstream

pytestmark = pytest.mark.components

CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
DRAIN_DELAY = 2.0


@dataclass
class Fleet:
    guards: list[Guard]
    haproxy: HAProxy
    upstream: FakeUpstream

    def guard(self, name: str) -> Guard:
        return next(g for g in self.guards if g.name == name)


@dataclass
class Outcome:
    started: float
    status: int | None = None
    served_by: str | None = None
    error: str | None = None
    body: str = ""


async def call(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Outcome:
    outcome = Outcome(time.monotonic())
    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=30)) as r:
            outcome.body = (await r.read()).decode()
            outcome.status, outcome.served_by = r.status, r.headers.get("x-served-by")
    except (aiohttp.ClientError, TimeoutError) as exc:
        outcome.error = type(exc).__name__
    return outcome


def start_guard(name: str, port: int, tmp_path: Any, upstream: FakeUpstream, processes: list[Process]) -> Guard:
    guard = Guard(
        name,
        port,
        tmp_path,
        "--upstream",
        upstream.url,  # type: ignore[attr-defined]
        "--workers",
        "1",
        "--drain-delay",
        str(DRAIN_DELAY),
        "--shutdown-grace",
        "30",
    )
    processes.append(guard)
    return guard.start()


async def served_by_all(fleet: Fleet, names: set[str], timeout: float = 30) -> None:
    """Wait until HAProxy sends requests to every replica in `names`."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while not names <= seen:
            assert time.monotonic() < deadline, f"HAProxy only reached {seen}:\n{fleet.haproxy.output[-2000:]}"
            outcome = await call(session, fleet.haproxy.url("/v1/chat/completions"), CHAT)
            if outcome.served_by:
                seen.add(outcome.served_by)
            await asyncio.sleep(0.05)


@pytest.fixture
async def fleet(tmp_path, start_upstream, processes) -> AsyncIterator[Fleet]:
    upstream = await start_upstream()
    guards = [start_guard(name, free_port(), tmp_path, upstream, processes) for name in ("a", "b", "c")]
    await all_ready(guards)
    haproxy = HAProxy(tmp_path, guards)
    processes.append(haproxy)
    haproxy.start()
    fleet = Fleet(guards, haproxy, upstream)
    await served_by_all(fleet, {"a", "b", "c"})
    yield fleet


async def test_sigterm_on_one_replica_loses_none_of_50_streams_and_it_gets_no_new_requests(fleet):
    fleet.upstream.chunk_delay, fleet.upstream.stream_chunks = 0.1, 30  # 3 s streams
    url = fleet.haproxy.url("/v1/chat/completions")
    a = fleet.guard("a")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        streams = [asyncio.create_task(call(session, url, {**CHAT, "stream": True})) for _ in range(50)]
        while sum(1 for r in fleet.upstream.received if r.json().get("stream")) < 50:
            await asyncio.sleep(0.02)
        a.signal(signal.SIGTERM)
        terminated = time.monotonic()
        later: list[Outcome] = []
        while time.monotonic() - terminated < DRAIN_DELAY + 1:
            later.append(await call(session, url, CHAT))
            await asyncio.sleep(0.05)
        results = await asyncio.gather(*streams)
    assert [r.error for r in results if r.error] == []
    assert all(r.status == 200 and r.body.count("part") == 30 and r.body.endswith("[DONE]\n\n") for r in results)
    assert {r.served_by for r in results} == {"a", "b", "c"}
    assert all(r.status == 200 for r in later), [(r.status, r.error) for r in later if r.status != 200]
    # One failed check (250 ms apart) takes it out; allow for a slow machine.
    assert all(r.served_by != "a" for r in later if r.started - terminated > 1.0)
    assert await a.exited(40) == 0
    [stopped] = a.events("stopped")
    assert stopped["in_flight_at_close"] >= 1 and stopped["cancelled"] == 0
    assert stopped["completed_after_close"] == stopped["in_flight_at_close"]


async def test_sigkill_on_one_replica_fails_only_what_it_had_in_flight_and_it_comes_back(fleet, tmp_path, processes):
    fleet.upstream.delay = 0.3
    url = fleet.haproxy.url("/v1/chat/completions")
    b = fleet.guard("b")
    outcomes: list[Outcome] = []
    clients = 4
    stop_at = time.monotonic() + 5

    async def client(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < stop_at:
            outcomes.append(await call(session, url, CHAT))

    async with aiohttp.ClientSession() as session:
        load = [asyncio.create_task(client(session)) for _ in range(clients)]
        await asyncio.sleep(1.5)
        b.signal(signal.SIGKILL)
        killed = time.monotonic()
        await asyncio.gather(*load)
    failed = [o for o in outcomes if o.status != 200]
    assert len(failed) <= clients and all(killed - 0.5 < o.started < killed for o in failed)
    after = [o for o in outcomes if o.started > killed + 1.0]
    assert after and all(o.status == 200 and o.served_by != "b" for o in after)

    back = start_guard("b", b.port, tmp_path, fleet.upstream, processes)
    await back.until_ready()
    await served_by_all(fleet, {"a", "b", "c"})
