"""The large-body threads are shared fairly between clients, and a client that hangs up stops
its counting: one client's large bodies take one thread at a time, so another client's large
request is counted beside them instead of behind them, and a job whose client left is dropped
from the queue, or told to stop if it is running.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import string
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from proxy.core.work_budget import current_event
from proxy.server.backends.models import Models
from proxy.server.threads.placement import large_body_slots
from tests.adversarial.conftest import GuardServer, anthropic_body_of, body_of, post, prose

ATTACKER = {"Authorization": "Bearer attacker-key"}
HONEST = {"Authorization": "Bearer honest-key"}


async def slots(guard: GuardServer) -> tuple[int, int, Any]:
    """The large-body threads' (busy, queued, stats), read on the guard's loop."""
    return await guard.on_guard_loop(
        lambda: (large_body_slots().busy, large_body_slots().queued, large_body_slots().stats)
    )


async def until(guard: GuardServer, condition: Callable[[int, int, Any], bool]) -> None:
    """Wait until the slots meet `condition`: a poll of the guard's state, 30 s at most."""
    for _ in range(1200):
        if condition(*await slots(guard)):
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"the slots never got there: {await slots(guard)}")


@dataclass
class HeldCount:
    """A real tokenizer whose counts made in a large-body thread (where a cancel event is bound)
    wait for `release`: the first such count sets `entered`, so a test knows a job is running and
    holds it running for as long as it needs."""

    entered: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)

    def guard(self, model_map: Any) -> Callable[[Any], Models]:
        def make(settings: Any) -> Models:
            models = Models(settings, model_map)
            spec = models.profile("gpt-4o").tokenizer
            models.tokenizers._loaded[spec] = _Held(models.tokenizers.get(spec), self)  # type: ignore[assignment]
            return models

        return make


@dataclass
class _Held:
    base: Any
    gate: HeldCount

    @property
    def name(self) -> str:
        return self.base.name  # type: ignore[no-any-return]

    @property
    def identity(self) -> str:
        return self.base.identity  # type: ignore[no-any-return]

    @property
    def exact(self) -> bool:
        return self.base.exact  # type: ignore[no-any-return]

    def count(self, text: str) -> int:
        if current_event() is not None and not self.gate.release.is_set():
            self.gate.entered.set()
            self.gate.release.wait(60)
        return self.base.count(text)  # type: ignore[no-any-return]

    def count_many(self, texts: list[str]) -> list[int]:
        return [self.count(t) for t in texts]


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
    async def test_an_honest_large_request_is_counted_beside_another_clients_two_not_behind_them(
        self, serve_guard, prober, settings
    ):
        guard = await serve_guard(settings(server={"client_keys": ["attacker-key", "honest-key"]}))
        # Over server.offload_bytes: counted in the large-body threads; new each time (a re-send is counted from the cache).
        honest = [body_of(f"{i} " + prose(350_000)) for i in range(3)]
        # Words of random letters: cut into slices and encoded whole (a text with no spaces is
        # bounded at once, and would be done before its client leaves).
        attacks = [anthropic_body_of(f"{i} " + words(12_000_000), model="gpt-4o") for i in range(2)]  # seconds each
        chat, count = guard.url("/v1/chat/completions"), guard.url("/v1/messages/count_tokens")
        for body in honest[:2]:  # the tokenizer and the routes warmed as for any request
            assert (await post(chat, body, HONEST))[0] == 200
        base = await prober.baseline(guard)
        async with prober.during(guard) as during:
            # Counting both takes the attacker's thread many seconds, more on a loaded machine: a generous timeout.
            attackers = [asyncio.create_task(post(count, attack, ATTACKER, timeout=300)) for attack in attacks]
            await until(guard, lambda busy, queued, stats: busy == 1 and queued == 1)  # one counts, one waits
            status, answer, _ = await post(chat, honest[2], HONEST)
            waited_behind_them = attackers[1].done()
            attacked = await asyncio.gather(*attackers)
        assert status == 200 and json.loads(answer)["object"] == "chat.completion"
        assert not waited_behind_them, "the honest request was answered only after the attacker's queued body"
        assert [status for status, _, _ in attacked] == [200, 200]  # counted in turn, not refused
        prober.assert_responsive(base, during)

    async def test_a_client_that_hangs_up_stops_its_queued_counting_and_is_told_to_stop_the_running_one(
        self, serve_guard, settings, model_map
    ):
        gate = HeldCount()
        guard = await serve_guard(settings(server={"client_keys": ["attacker-key"]}), guard=gate.guard(model_map))
        # Over server.offload_bytes: parsed and counted in the large-body threads.
        attacks = [anthropic_body_of(f"{i} " + words(400_000), model="gpt-4o") for i in range(2)]
        count = guard.url("/v1/messages/count_tokens")

        # One client, one thread: the first body's count is held at its first slice, so the second
        # waits behind it. Each hang-up is sent on its own and seen to arrive before the next, so
        # that the waiting job is still waiting when its client leaves (had the running one stopped
        # first, the waiting one would have started, and been told to stop in its turn).
        leave_running, leave_waiting = asyncio.Event(), asyncio.Event()
        running = asyncio.create_task(send_until(count, attacks[0], ATTACKER, leave_running))
        assert await asyncio.to_thread(gate.entered.wait, 60), "the first body's count never started"
        waiting = asyncio.create_task(send_until(count, attacks[1], ATTACKER, leave_waiting))
        await until(guard, lambda busy, queued, stats: queued == 1)
        leave_waiting.set()
        await waiting
        await until(guard, lambda busy, queued, stats: stats.dropped == 1)  # dropped from the queue: it never ran
        leave_running.set()
        await running
        await until(guard, lambda busy, queued, stats: stats.told_to_stop == 1)  # its cancel event set
        gate.release.set()  # the held slice returns; the count stops at its next checkpoint
        await until(guard, lambda busy, queued, stats: busy == 0)  # held until the work has really returned, then freed
        stats = (await slots(guard))[2]
        assert stats.dropped == 1 and stats.told_to_stop == 1
