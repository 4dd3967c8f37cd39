"""The memory request bodies take is bounded across requests, whoever sends them (docs/security.md,
"The memory bound"): the guard runs as a real process with its default limits, in front of the
suite's fake upstream, and its resident memory is read from /proc. Sixteen gzip uploads that
inflate to 31 MiB each, sent at once: the bodies past the process's budget (or past one client's
share) are refused at once with 503 (429) and `Retry-After`, the peak stays within
`HELD_BYTES_FACTOR` times the budget over the idle guard, and `/livez` keeps answering. A hundred
clients that send 2 MB and hang up: what they held is given back as each goes."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import json
import random
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from proxy.config.settings import ServerSettings
from tests.support.memory_bounds import HELD_BYTES_FACTOR
from tests.support.processes import Guard, descriptors, guard_before_fake_upstream, status_mib

pytestmark = [
    pytest.mark.components,  # a guard process counting three 31 MiB bodies: 20-40 s on a shared 2-core machine
    pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="resident memory is read from Linux's /proc"),
]

MiB = 1024 * 1024
BUDGET_MIB = ServerSettings().body_memory[0] / MiB  # what the guard below runs with: the defaults
CHAT = "/v1/chat/completions"


def compressible_chat(size: int) -> bytes:
    """A chat body of `size` bytes of words that gzip about 40 times smaller (16 KiB stretches of
    random words, each said 16 times), as an attacker's inflating upload."""
    rng = random.Random(3)
    vocabulary = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 9))) for _ in range(300)]
    stretches: list[str] = []
    while len(stretches) * 16384 < size:
        stretches += [" ".join(rng.choices(vocabulary, k=2800))[:16384]] * 16
    text = "".join(stretches)[:size]
    return json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": text}]}).encode()


@pytest.fixture
async def guard(tmp_path: Path) -> AsyncIterator[Guard]:
    """`context-guard serve` with the default limits, one worker, in front of the fake upstream; warm
    (its vocabulary loaded) and its peak memory reset, so that VmHWM is the attack's."""
    async with guard_before_fake_upstream(tmp_path, warm=True) as process:
        yield process


def assert_within_the_bound(guard: Guard, idle_mib: float) -> None:
    grown = status_mib(guard.pid, "VmHWM") - idle_mib
    bound = HELD_BYTES_FACTOR * BUDGET_MIB
    assert grown <= bound, f"the guard grew by {grown:.0f} MiB at its peak; the documented bound is {bound:.0f}"


@dataclass
class Liveness:
    """How `/livez` answered while an attack ran on a guard in its own process."""

    answered: int = 0
    failures: int = 0


@contextlib.asynccontextmanager
async def livez_asked(guard: Guard) -> AsyncIterator[Liveness]:
    """`/livez` asked over one kept-alive connection from a thread and loop of its own while the
    block runs, and once more after it. How fast it answers is the bench's to measure
    (bench/adversarial.py); here every answer must come."""
    seen, stop = Liveness(), threading.Event()

    async def ask() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            while not stop.is_set():
                try:
                    async with session.get(guard.url("/livez")) as response:
                        await response.read()
                        ok = response.status == 200
                except (aiohttp.ClientError, TimeoutError):
                    ok = False
                seen.answered, seen.failures = seen.answered + ok, seen.failures + (not ok)
                await asyncio.sleep(0.01)  # a pace for the asking, not an ordering

    thread = threading.Thread(target=lambda: asyncio.run(ask()), name="livez", daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        await asyncio.to_thread(thread.join, 35)
    async with aiohttp.ClientSession() as session, session.get(guard.url("/livez")) as after:
        assert after.status == 200, "/livez gave no answer after the attack"


def assert_always_answered(during: Liveness) -> None:
    assert during.answered > 0 and during.failures == 0, f"/livez: {during}"


class TestSixteenInflatingUploads:
    async def test_sixteen_keys_at_once_stay_within_the_bound_and_the_rest_get_503(self, guard):
        """Each key is a client of its own: the process budget (three bodies of the limit) is what holds."""
        upload = gzip.compress(compressible_chat(31 * MiB), 6)
        assert len(upload) < MiB
        idle = status_mib(guard.pid, "VmRSS")

        async def send(key: int) -> tuple[int, str | None, dict[str, object]]:
            headers = {
                "Content-Type": "application/json",
                "Content-Encoding": "gzip",
                "Authorization": f"Bearer k{key}",
            }
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session,
                session.post(guard.url(CHAT), data=upload, headers=headers) as answer,
            ):
                return answer.status, answer.headers.get("Retry-After"), await answer.json()

        async with livez_asked(guard) as during:
            answers = await asyncio.gather(*(send(key) for key in range(16)))
        statuses = sorted(status for status, _, _ in answers)
        assert 1 <= statuses.count(200) <= 3 and statuses.count(503) == 16 - statuses.count(200), statuses
        refused = [(after, body) for status, after, body in answers if status == 503]
        assert all(after == "2" and body["error"]["code"] == "overloaded" for after, body in refused)  # type: ignore[index]
        assert_within_the_bound(guard, idle)
        assert_always_answered(during)


class TestAHundredHungUpClients:
    async def test_their_bodies_go_at_once_and_the_guard_stays_within_the_bound(self, guard):
        """A hundred clients each send a 2 MB chat body and close the connection without reading:
        whatever each held is given back as it goes (its descriptors too), so the client's whole
        share is free again at once."""
        body = compressible_chat(2 * 10**6)
        head = (
            f"POST {CHAT} HTTP/1.1\r\nHost: guard\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        idle, open_before = status_mib(guard.pid, "VmRSS"), descriptors(guard.pid)

        async def hang_up() -> None:
            _, writer = await asyncio.open_connection("127.0.0.1", guard.port)
            writer.write(head + body)
            await writer.drain()
            writer.close()
            await writer.wait_closed()

        async with livez_asked(guard) as during:
            await asyncio.gather(*(hang_up() for _ in range(100)))
            async with asyncio.timeout(10):
                while descriptors(guard.pid) > open_before + 1:  # the prober's own connection
                    await asyncio.sleep(0.05)
        assert_within_the_bound(guard, idle)
        assert_always_answered(during)
        # The client's share (two bodies of the limit) is free: two bodies of 31 MiB are read whole
        # (and refused as not JSON), not 429.
        broken = b'{"model": "gpt-4o", "messages": [' + b" " * (31 * MiB)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:

            async def send() -> int:
                async with session.post(
                    guard.url(CHAT), data=broken, headers={"Content-Type": "application/json"}
                ) as r:
                    return r.status

            assert await asyncio.gather(send(), send()) == [400, 400]
