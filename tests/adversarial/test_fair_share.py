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

import aiohttp

from proxy.server.placement import large_body_slots
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
        leave = asyncio.Event()
        senders = [asyncio.create_task(send_until(count, attack, ATTACKER, leave)) for attack in attacks]
        # The client leaves once one of its jobs runs and another waits (its one thread is busy), and
        # the running one has run for 0.2 s: a count, which goes on for seconds, not a body's parse,
        # which may end between this look and the hang-up reaching the guard.
        held_since: tuple[int, float] | None = None  # (jobs started, when) while one runs and one waits
        for _ in range(1200):
            busy, queued, started = await guard.on_guard_loop(
                lambda: (large_body_slots().busy, large_body_slots().queued, large_body_slots().stats.started)
            )
            now = asyncio.get_running_loop().time()
            if busy < 1 or queued < 1:
                held_since = None
            elif held_since is None or held_since[0] != started:
                held_since = (started, now)
            elif now - held_since[1] >= 0.2:
                break
            await asyncio.sleep(0.025)
        leave.set()
        await asyncio.gather(*senders)
        stats = await guard.on_guard_loop(lambda: large_body_slots().stats)
        # One client, one thread: the second body waited and was dropped when its client left;
        # the first was counting, and its cancel event was set (counting in slices stops on it).
        assert stats.dropped >= 1 and stats.told_to_stop >= 1
        for _ in range(600):  # the thread is held until the work has really returned, then freed
            if await guard.on_guard_loop(lambda: large_body_slots().busy) == 0:
                break
            await asyncio.sleep(0.05)
        assert await guard.on_guard_loop(lambda: large_body_slots().busy) == 0
