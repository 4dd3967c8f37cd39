"""`--workers 2` as a real process tree: SIGHUP reloads every worker, SIGTERM stops them all."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import aiohttp
import pytest

from tests.support.processes import Guard

pytestmark = pytest.mark.components

CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}


def config(upstream_url: str) -> str:
    return f"log:\n  format: json\nupstreams:\n  fake:\n    base_url: {upstream_url}\n"


async def until(condition, timeout: float = 30) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.1)


async def chat(guard: Guard, times: int) -> list[int]:
    async with aiohttp.ClientSession() as session:
        statuses = []
        for _ in range(times):
            # A new connection each time, so the kernel can hand it to either worker.
            async with session.post(guard.url("/v1/chat/completions"), json=CHAT, headers={"Connection": "close"}) as r:
                statuses.append(r.status)
        return statuses


async def test_sighup_reloads_every_worker_and_a_bad_config_is_refused_by_each(tmp_path, start_upstream, processes):
    first, second = await start_upstream(), await start_upstream()
    path = tmp_path / "guard.yaml"
    path.write_text(config(first.url))
    guard = Guard("workers", 0, tmp_path, "--config", str(path), "--workers", "2", "--drain-delay", "0.2")
    processes.append(guard)
    guard.start()
    await guard.until_ready()
    await until(lambda: len(guard.events("listening")) == 2)
    assert await chat(guard, 4) == [200] * 4 and len(first.received) == 4

    path.write_text(config(second.url))
    guard.signal(signal.SIGHUP)
    await until(lambda: len(guard.events("reloaded")) == 2)
    assert await chat(guard, 6) == [200] * 6 and len(second.received) == 6 and len(first.received) == 4

    path.write_text("server:\n  port: lots\n")
    guard.signal(signal.SIGHUP)
    await until(lambda: len(guard.events("reload_refused")) == 2)
    refused = guard.events("reload_refused")
    assert {e["worker"] for e in refused} == {1, 2}
    assert all(e["reason"] == f"{path}: server.port: must be a whole number, not 'lots'" for e in refused)
    assert await chat(guard, 2) == [200] * 2 and len(second.received) == 8

    guard.signal(signal.SIGTERM)
    assert await guard.exited(30) == 0
    events = guard.events()
    assert all("worker" in e and "pid" in e for e in events)
    stopped = guard.events("stopped")
    assert sorted(e["worker"] for e in stopped) == [0, 1, 2]
    assert next(e for e in stopped if e["worker"] == 0)["exit_codes"] == {"1": 0, "2": 0}
    assert {e["worker"] for e in guard.events("request")} <= {1, 2}


async def test_a_worker_that_dies_is_replaced(tmp_path, start_upstream, processes):
    upstream = await start_upstream()
    guard = Guard("respawn", 0, tmp_path, "--upstream", upstream.url, "--workers", "2", "--drain-delay", "0")
    processes.append(guard)
    guard.start()
    await guard.until_ready()
    await until(lambda: len(guard.events("started")) == 1)
    victim = guard.events("started")[0]["pids"]["2"]
    os.kill(victim, signal.SIGKILL)
    await until(lambda: len(guard.events("listening")) == 3, timeout=60)
    [died] = guard.events("worker_died")
    assert died["died_worker"] == 2 and died["exit_code"] == -signal.SIGKILL
    assert await chat(guard, 4) == [200] * 4


async def test_the_page_of_recent_decisions_shows_every_worker_s_decisions_on_every_load(
    tmp_path, start_upstream, processes
):
    """With the default two workers the kernel hands each page load to either: each shows all."""
    upstream = await start_upstream()
    guard = Guard("page", 0, tmp_path, "--upstream", upstream.url, "--workers", "2", "--drain-delay", "0")
    processes.append(guard)
    guard.start()
    await guard.until_ready()
    await until(lambda: len(guard.events("listening")) == 2)
    sent = 0

    def chats() -> list[dict[str, object]]:  # not the /readyz 503s logged while vocabularies loaded
        return [e for e in guard.events("request") if e["path"] == "/v1/chat/completions"]

    while {e["worker"] for e in chats()} != {1, 2}:  # until both have served some
        assert sent < 200, "the kernel gave every connection to one worker"
        assert await chat(guard, 1) == [200]
        sent += 1
        await until(lambda n=sent: len(chats()) == n)
    async with aiohttp.ClientSession() as session:
        for _ in range(8):
            headers = {"Connection": "close"}
            async with session.get(guard.url("/context-guard/recent.json"), headers=headers) as r:
                page = await r.json()
            rows = [row for row in page["rows"] if row["kind"] == "chat"]
            assert len(rows) == sent and {row["worker"] for row in rows} == {1, 2}
            assert page["workers"]["answered"] == [1, 2] and page["workers"]["missing"] == []
    guard.signal(signal.SIGTERM)
    assert await guard.exited(30) == 0
