"""Issue 24, item 4: fair share of the large-body threads, and cancellation.

On main, two 6 MB adversarial requests held both large-body threads and an honest 350 KB request
took 30.1 s instead of 0.02 s; the attackers had hung up after 0.3 s, but their counting went on.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import string
from collections.abc import Callable
from typing import Any

import aiohttp

from proxy.server.threads.placement import large_body_slots
from tests.adversarial.conftest import anthropic_body_of, body_of, post, prose

ATTACKER = {"Authorization": "Bearer attacker-key"}
HONEST = {"Authorization": "Bearer honest-key"}


def letters(size: int) -> str:
    return "".join(random.Random(7).choices(string.ascii_letters, k=size))


async def send_until(url: str, body: bytes, headers: dict[str, str], leave: asyncio.Event) -> None:
    """Send `body` and hang up, without reading an answer, once `leave` is set (as an attacker does)."""
    async with aiohttp.ClientSession() as session:
        sending = asyncio.ensure_future(session.post(url, data=body, headers={"Content-Type": "application/json", **headers}))
        await leave.wait()
        sending.cancel()
        with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
            response = await sending
            response.close()


def words(size: int) -> str:
    """Random letters in words of five, one space apart: `size` characters that cost a tokenizer
    real work (every slice is encoded)."""
    text = letters(size)
    return " ".join(text[i : i + 5] for i in range(0, size, 6))


class TestFairShare:
    async def test_an_honest_large_request_is_served_in_its_usual_time_while_another_clients_two_are_counted(
        self, serve_guard, prober, settings
    ):
        guard = await serve_guard(settings(server={"client_keys": ["attacker-key", "honest-key"]}))
        # Over server.offload_bytes: counted in the large-body threads; new each time (a re-send is counted from the cache).
        honest = [body_of(f"{i} " + prose(350_000)) for i in range(3)]
        # Words of random letters: cut into slices and encoded whole (a text with no spaces is
        # bounded at once, and would be done before its client leaves).
        attacks = [anthropic_body_of(f"{i} " + words(12_000_000), model="gpt-4o") for i in range(2)]  # seconds each
        chat, count = guard.url("/v1/chat/completions"), guard.url("/v1/messages/count_tokens")
        usual = min([(await post(chat, body, HONEST))[2] for body in honest[:2]])
        base = await prober.baseline(guard)
        async with prober.during(guard) as during:
            attackers = [asyncio.create_task(post(count, attack, ATTACKER)) for attack in attacks]  # they wait
            await asyncio.sleep(0.35)
            status, answer, seconds = await post(chat, honest[2], HONEST)
            attacked = await asyncio.gather(*attackers)
        assert status == 200 and json.loads(answer)["object"] == "chat.completion"
        assert seconds < max(1.5, 4 * usual), f"honest request took {seconds:.2f} s (usual {usual:.2f} s)"
        assert [status for status, _, _ in attacked] == [200, 200]  # counted in turn, not refused
        prober.assert_responsive(base, during)

    async def test_a_client_that_hangs_up_stops_its_queued_counting_and_is_told_to_stop_the_running_one(
        self, serve_guard, settings
    ):
        guard = await serve_guard(settings(server={"client_keys": ["attacker-key"]}))
        # Words of random letters: cut into slices and encoded whole (a text with no spaces is
        # bounded at once, and would be done before its client leaves).
        attacks = [anthropic_body_of(f"{i} " + words(12_000_000), model="gpt-4o") for i in range(2)]
        count = guard.url("/v1/messages/count_tokens")

        async def slots() -> tuple[int, int, Any]:
            return await guard.on_guard_loop(
                lambda: (large_body_slots().busy, large_body_slots().queued, large_body_slots().stats)
            )

        async def until(condition: Callable[[int, int, Any], bool]) -> None:
            for _ in range(1200):
                if condition(*await slots()):
                    return
                await asyncio.sleep(0.025)
            raise AssertionError(f"the slots never got there: {await slots()}")

        # One client, one thread: the first body counts (for seconds), then the second waits.
        # Each hang-up is sent on its own and seen to arrive before the next, so that the waiting
        # job is still waiting when its client leaves (had the running one stopped first, the
        # waiting one would have started, and been told to stop in its turn).
        leave_running, leave_waiting = asyncio.Event(), asyncio.Event()
        running = asyncio.create_task(send_until(count, attacks[0], ATTACKER, leave_running))
        held: list[tuple[int, float]] = []  # (jobs started, when): a job that has run 0.2 s is a count, not a parse

        def counting(busy: int, queued: int, stats: Any) -> bool:
            now = asyncio.get_running_loop().time()
            if busy != 1 or (held and held[-1][0] != stats.started):
                held.clear()
            if busy == 1 and not held:
                held.append((stats.started, now))
            return bool(held) and now - held[-1][1] >= 0.2

        await until(counting)
        waiting = asyncio.create_task(send_until(count, attacks[1], ATTACKER, leave_waiting))
        await until(lambda busy, queued, stats: queued == 1)
        leave_waiting.set()
        await waiting
        await until(lambda busy, queued, stats: stats.dropped == 1)  # dropped from the queue: it never ran
        leave_running.set()
        await running
        await until(lambda busy, queued, stats: stats.told_to_stop == 1)  # its cancel event set
        await until(lambda busy, queued, stats: busy == 0)  # held until the work has really returned, then freed
        stats = (await slots())[2]
        assert stats.dropped == 1 and stats.told_to_stop == 1
