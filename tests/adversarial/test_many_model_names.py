"""Model names a client makes up cost the guard nothing that lasts (docs/security.md, "What clients
can and cannot influence"): measured on guards running as real processes, in front of the suite's
fake upstream, their memory read from /proc, and in this process, its calls profiled.

- Twenty distinct 4 MB model names, each refused with 400, grew the guard by 161 MB: the refusal's
  error kept each body and its parsed values alive in reference cycles that the large-body
  threads' collector pause froze. Now under `GROWTH_MB`.
- Once 4,200 names had filled the profile cache, which then kept no new name, a chat naming a
  model first seen cost 1.1-1.2x the CPU of one before: its name was resolved twice a request
  (4% more of the guard's own calls, and the CPU of each resolution). Now the same work as
  before, within `WORK_RATIO`.
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import pstats
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
import pytest

from tests.support.processes import Guard, fake_upstream_config

pytestmark = [
    pytest.mark.components,  # guard processes and thousands of requests: 20-50 s on a shared 2-core machine
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="memory and CPU are read from Linux's /proc"),
]

GROWTH_MB = 50.0
WORK_RATIO = 1.02  # the guard's own calls for a new model's chat, after 4,200 names against before
CHAT = "/v1/chat/completions"
PROXY = str(Path(__file__).parents[2] / "proxy")


def resident_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    raise KeyError("VmRSS")


@pytest.fixture
async def guards(tmp_path: Path) -> AsyncIterator[Callable[[int], asyncio.Future[list[Guard]]]]:
    """`await guards(n)`: n `context-guard serve` processes, one worker each, in front of one fake
    upstream, ready and warm."""
    async with AsyncExitStack() as stack:
        config = await stack.enter_async_context(fake_upstream_config(tmp_path))

        async def start(count: int) -> list[Guard]:
            started = []
            for i in range(count):
                guard = Guard(f"guard-{i}", 0, tmp_path, "--config", str(config), "--workers", "1").start()
                stack.callback(guard.stop)
                started.append(guard)
            for guard in started:
                await guard.until_ready()
                for n in range(20):
                    assert await chat(guard, "gpt-4o", f"warm up {n}") == 200
            return started

        yield start  # type: ignore[misc]


async def chat(guard: Guard, model: str, text: str) -> int:
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": text}]}).encode()
    async with (
        aiohttp.ClientSession() as session,
        session.post(guard.url(CHAT), data=body, headers={"Content-Type": "application/json"}) as answer,
    ):
        await answer.read()
        return answer.status


class TestTwentyRefusedFourMegabyteNames:
    @pytest.mark.parametrize("path", [CHAT, "/v1/embeddings"], ids=["counted", "passed-through"])
    async def test_leave_the_guard_within_50_mb_of_where_it_was(self, guards, path):
        (guard,) = await guards(1)
        before = resident_mb(guard.pid)
        async with aiohttp.ClientSession() as session:
            for i in range(20):
                name = f"gpt-4o-{i:02d}" + "x" * 4_000_000
                body = json.dumps({"model": name, "messages": [{"role": "user", "content": "hi"}], "input": "hi"})
                async with session.post(guard.url(path), data=body, headers={"Content-Type": "application/json"}) as r:
                    answer = await r.json()
                    assert r.status == 400 and "at most 256 characters" in answer["error"]["message"]
        for n in range(5):  # the guard goes on serving, and what it held for the refusals is gone
            assert await chat(guard, "gpt-4o", f"after {n}") == 200
        grown = resident_mb(guard.pid) - before
        assert grown < GROWTH_MB, f"twenty refused names left the guard {grown:.0f} MB larger"


class TestAModelFirstSeenAfterManyNames:
    async def test_takes_the_guard_the_same_work_as_one_before(self, serve_guard):
        """The guard's own Python calls (its modules' functions, profiled on its event loop, where
        a small chat is served whole) for 50 chats naming models first seen: after 4,200 other
        names, at most `WORK_RATIO` times those of 50 before: 18,466 against 18,559 (with a cache
        that kept no new name: 19,224, each new name resolved twice a request). The CPU itself,
        measured on two guard processes in alternate rounds, varies more than that on a shared
        machine (0.96-1.29 per round), so the work is what is held to its bound."""
        guard = await serve_guard()

        async def on_the_guards_loop(tag: str) -> int:
            return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(calls_for_new_models(tag), guard.loop))

        async def calls_for_new_models(tag: str) -> int:
            profile = cProfile.Profile()
            async with aiohttp.ClientSession() as session:

                async def one(i: int) -> None:
                    body = {"model": f"gpt-4o-{tag}-{i:03d}", "messages": [{"role": "user", "content": f"chat {i}"}]}
                    profile.enable()
                    async with session.post(guard.url(CHAT), json=body) as answer:
                        await answer.read()
                    profile.disable()
                    assert answer.status == 200

                for i in range(50):
                    await one(i)
            stats = pstats.Stats(profile).stats  # type: ignore[attr-defined]
            return sum(calls for (path, _, _), (_, calls, *_) in stats.items() if PROXY in path)

        before = await on_the_guards_loop("before")
        async with aiohttp.ClientSession() as session:
            for start in range(0, 4200, 200):

                async def name(i: int) -> int:
                    body = {"model": f"gpt-4o-named-{i}", "messages": [{"role": "user", "content": "hi"}]}
                    async with session.post(guard.url(CHAT), json=body) as answer:
                        return answer.status

                assert set(await asyncio.gather(*(name(i) for i in range(start, start + 200)))) == {200}
        after = await on_the_guards_loop("aftr")
        assert 0 < after <= WORK_RATIO * before, f"the guard's calls for 50 new models: {before} before, {after} after"
