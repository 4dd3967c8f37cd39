"""FairSlots: large-body work shared per client, in fair order, and stopped when its request goes."""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import pytest

from proxy.core.work_budget import WorkCancelled, checkpoint
from proxy.server.edge.credentials import credential_digest
from proxy.server.threads.placement import FairSlots, client_key


@pytest.fixture
def pool():
    executor = ThreadPoolExecutor(max_workers=2)
    yield executor
    executor.shutdown(wait=True, cancel_futures=True)


class Gate:
    """Work that blocks until released, and says when it started."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, value: str) -> str:
        self.started.set()
        assert self.release.wait(10)
        return value


async def started(gate: Gate) -> None:
    assert await asyncio.to_thread(gate.started.wait, 10)


class TestClientKey:
    def test_a_credential_is_the_client_hashed_never_kept_as_it_is(self):
        key = client_key(credential_digest({"Authorization": "Bearer sk-secret"}), "10.0.0.1")
        assert key.startswith("key:") and "secret" not in key
        assert key == client_key(credential_digest({"Authorization": "Bearer sk-secret"}), "10.0.0.2")
        assert key != client_key(credential_digest({"Authorization": "Bearer sk-other"}), "10.0.0.1")

    def test_an_api_key_header_counts_as_a_credential(self):
        assert client_key(credential_digest({"x-api-key": "k1"}), None) != client_key(
            credential_digest({"x-api-key": "k2"}), None
        )

    def test_googles_key_header_and_query_parameter_count_as_credentials(self):
        """Two Gemini clients behind one address are two clients, whichever way they send their key."""
        by_header = {client_key(credential_digest({"x-goog-api-key": k}), "10.0.0.1") for k in ("g1", "g2")}
        by_query = {client_key(credential_digest({}, {"key": k}), "10.0.0.1") for k in ("g1", "g2")}
        assert len(by_header) == 2 and all(key.startswith("key:") for key in by_header)
        assert by_query == by_header  # the same key is the same client, header or query

    def test_without_a_credential_the_client_is_its_peer_address(self):
        assert client_key(credential_digest({}), "10.0.0.1") == "peer:10.0.0.1"
        assert client_key(credential_digest({}), None) == "peer:?"


class TestFairSlots:
    async def test_one_client_holds_at_most_its_share_while_another_takes_the_free_thread(self, pool):
        slots = FairSlots(pool, workers=2, per_client=1)
        first, second, other = Gate(), Gate(), Gate()
        a1 = asyncio.create_task(slots.run("attacker", first, "a1"))
        await started(first)
        a2 = asyncio.create_task(slots.run("attacker", second, "a2"))
        honest = asyncio.create_task(slots.run("honest", other, "h"))
        await started(other)  # the honest client's work started while the attacker's second waits
        assert not second.started.is_set() and slots.held_by("attacker") == 1 and slots.queued == 1
        other.release.set()
        assert await honest == "h"
        first.release.set()
        second.release.set()
        assert (await a1, await a2) == ("a1", "a2")
        assert slots.busy == 0 and slots.queued == 0

    async def test_with_equal_shares_the_oldest_waiting_job_goes_first(self, pool):
        slots = FairSlots(pool, workers=1, per_client=1)
        order: list[str] = []
        gate = Gate()
        running = asyncio.create_task(slots.run("a", gate, "a0"))
        await started(gate)
        waiting = [asyncio.create_task(slots.run(c, order.append, c)) for c in ("a", "a", "b")]
        await asyncio.sleep(0)
        gate.release.set()
        await asyncio.gather(running, *waiting)
        assert order == ["a", "a", "b"]  # one thread, per client one: the oldest waiting job goes first

    async def test_work_cancelled_before_it_starts_never_runs(self, pool):
        slots = FairSlots(pool, workers=1, per_client=1)
        gate, ran = Gate(), threading.Event()
        running = asyncio.create_task(slots.run("a", gate, "x"))
        await started(gate)
        queued = asyncio.create_task(slots.run("b", ran.set))
        await asyncio.sleep(0)
        queued.cancel()
        with pytest.raises(asyncio.CancelledError):
            await queued
        gate.release.set()
        await running
        assert await slots.run("c", str, "next") == "next"  # one thread: the dropped job would have run first
        assert not ran.is_set() and slots.stats.dropped == 1 and slots.queued == 0

    async def test_work_running_when_cancelled_stops_at_its_next_checkpoint_and_holds_its_thread_until_then(self, pool):
        slots = FairSlots(pool, workers=1, per_client=1)
        entered, stopped = threading.Event(), threading.Event()

        def slices() -> None:
            entered.set()
            try:
                for _ in range(10_000):
                    checkpoint()
                    threading.Event().wait(0.001)
            except WorkCancelled:
                stopped.set()
                raise

        task = asyncio.create_task(slots.run("a", slices))
        assert await asyncio.to_thread(entered.wait, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await asyncio.to_thread(stopped.wait, 10)
        assert await slots.run("b", str, "next") == "next"  # one thread: granted once the stopped work let it go
        assert slots.busy == 0 and slots.stats.told_to_stop == 1

    async def test_checkpoint_outside_slot_work_returns_at_once(self):
        checkpoint()  # no event bound: nothing to stop

    async def test_a_base_exception_from_the_work_reaches_the_caller_and_frees_the_thread(self, pool):
        class Panic(BaseException):
            pass

        def panics() -> None:
            raise Panic("native library panicked")

        slots = FairSlots(pool, workers=1, per_client=1)
        with pytest.raises(Panic):
            await slots.run("a", panics)
        assert await slots.run("a", str, 1) == "1"


class Held:
    """What a job holds (a body, its parsed values): weakly referenced, to see when it goes."""


def refuse(held: Held) -> None:
    raise ValueError("refused")  # its frame holds `held`, and so does the error's traceback


class TestAFailedJob:
    async def test_keeps_nothing_it_held_once_its_error_is_handled_even_with_the_collector_off(self, pool):
        """A refused body is freed by reference counting when its request ends: its error's
        tracebacks and the wait for the job form no cycle, which the large-body threads' collector
        pause would keep until its next thaw."""
        slots = FairSlots(pool, workers=2, per_client=1)
        held = Held()
        gone = weakref.ref(held)
        gc.disable()
        try:
            try:
                await slots.run("client", refuse, held)
            except ValueError as error:
                assert str(error) == "refused" and error.__traceback__ is not None
            del held
            await asyncio.sleep(0)  # the callbacks the job's end scheduled (they hold its future) run
            assert gone() is None
        finally:
            gc.enable()
