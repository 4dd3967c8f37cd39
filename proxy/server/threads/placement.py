"""Where a request's work runs (on the event loop, in the medium-body or the large-body threads),
the threads shared fairly per client, and who a client is for that share and for shared state.

One event loop serves every request of a worker process, so work that grows with a body runs on
it only while it stays small; the rest goes to one of two thread pools:

- a **parse** is sized by the body's new bytes (`performed`): up to `INLINE_BYTES` on the loop, up
  to `server.offload_bytes` in the medium-body threads, above that in the large-body threads (one
  per core, at most four: more would only contend for the GIL);
- a **plan** is sized by the work it turns out to need (`planned`): a body of at most
  `INLINE_PLAN_BYTES` is planned on the loop within a budget of new work
  (`proxy.core.work_budget`), and moved to the medium-body threads when it would overspend.

Threads are few, so who gets one is decided here, on the event loop, not by the executor's
first-come queue (`FairSlots`):

- **Per client, a bounded share.** One client holds at most `per_client` threads at once
  (`workers - 1`, at least 1): a client sending several large bodies queues behind itself while
  another client's body takes the thread left free.
- **Fair order.** When a thread frees, the waiting job of the client with the fewest threads
  goes next (the oldest such job on a tie), so a client with many large bodies waiting does not
  starve one with a single body.
- **Cancellation.** When the request's coroutine is cancelled (aiohttp cancels the handler when
  the client hangs up), a job not started yet is dropped from the queue and never runs; a job
  running is told through the `threading.Event` bound to its context
  (`proxy.core.work_budget`): counting that works in slices calls
  `proxy.core.work_budget.checkpoint()` between slices and stops. The thread is counted as held
  until the work has really returned, so a client that hangs up cannot free its share early and
  take another.

Jobs run with the caller's context variables (the log's bound fields), like `asyncio.to_thread`.

Who a client is, its identity in one home, is told two ways. For the threads' share (`client_key`),
its credential (the first of `Authorization`, `x-api-key`, `api-key`, hashed:
`proxy.server.edge.credentials.credential_digest`, one digest of a short header per request, never
of the body, and never kept as such), else its peer's address, so that opening more connections
buys no more share. For the count cache, kept per client so that the time a request takes cannot
tell one client whether another sent a text (`proxy.core.counting.count_cache.ScopedCountCache`):
its credential, else the connection it came on (`client_scope`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import os
import threading
import traceback
import weakref
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from aiohttp import web

from proxy.core.work_budget import OverBudget, bound, budgeted
from proxy.server.threads.collector import CollectorPause
from proxy.tokenizers.vocabularies import lower_thread_priority

T = TypeVar("T")


def client_key(digest: bytes | None, peer: str | None) -> str:
    """Who a request is for fair sharing: its credential's digest (`key:` and hex digits:
    `proxy.server.edge.credentials.credential_digest`), else its peer address (`peer:` and the
    address); `peer:?` when neither is known."""
    return f"key:{digest.hex()}" if digest is not None else f"peer:{peer or '?'}"


@dataclass
class _Waiting:
    order: int
    grant: asyncio.Future[None]


@dataclass
class SlotStats:
    """What the slots did since start (for tests, metrics and the curious)."""

    started: int = 0
    finished: int = 0
    dropped: int = 0  # cancelled while waiting: never ran
    told_to_stop: int = 0  # cancelled while running: their event was set


@dataclass
class FairSlots:
    """Runs jobs in `executor` (which has `workers` threads), at most `per_client` per client at once."""

    executor: Executor
    workers: int
    per_client: int
    stats: SlotStats = field(default_factory=SlotStats)
    _running: dict[str, int] = field(default_factory=dict)
    _waiting: dict[str, deque[_Waiting]] = field(default_factory=dict)
    _order: itertools.count[int] = field(default_factory=itertools.count)

    def __post_init__(self) -> None:
        if self.workers < 1 or self.per_client < 1:
            raise ValueError("workers and per_client must be at least 1")

    @property
    def busy(self) -> int:
        """Threads held now (a cancelled job holds its thread until it has returned)."""
        return sum(self._running.values())

    def held_by(self, client: str) -> int:
        return self._running.get(client, 0)

    @property
    def queued(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    async def run(self, client: str, work: Callable[..., T], *args: Any) -> T:
        """`work(*args)` in a thread, when this client's share and a thread allow; cancelling the
        caller drops the job if it has not started and sets its cancel event if it has."""
        loop = asyncio.get_running_loop()
        waiting = _Waiting(next(self._order), loop.create_future())
        self._waiting.setdefault(client, deque()).append(waiting)
        self._dispatch()
        try:
            await waiting.grant
        except asyncio.CancelledError:
            if waiting.grant.done() and not waiting.grant.cancelled():  # granted as we were cancelled
                self._release(client)
            else:
                self._forget(client, waiting)
                self.stats.dropped += 1
            raise
        cancel = threading.Event()
        context = contextvars.copy_context()
        try:
            future = self.executor.submit(context.run, _bound_call, cancel, work, args)
        except BaseException:
            self._release(client)
            raise
        self.stats.started += 1
        future.add_done_callback(lambda _: _call_soon(loop, self._finished, client))
        try:
            return await asyncio.wrap_future(future, loop=loop)
        except asyncio.CancelledError:
            if not future.done():
                cancel.set()
                self.stats.told_to_stop += 1
            raise
        finally:
            # A failed job's error keeps this frame in its traceback, and the future keeps the
            # error: a cycle that would hold the request (its body) until a full collection.
            del future

    def _dispatch(self) -> None:
        while self.busy < self.workers:
            best: tuple[int, int, str] | None = None
            for client, queue in self._waiting.items():
                held = self._running.get(client, 0)
                if queue and held < self.per_client and (best is None or (held, queue[0].order) < best[:2]):
                    best = (held, queue[0].order, client)
            if best is None:
                return
            client = best[2]
            queue = self._waiting[client]
            waiting = queue.popleft()
            if not queue:
                del self._waiting[client]
            if waiting.grant.done():  # cancelled while waiting; `run` has counted it
                continue
            self._running[client] = self._running.get(client, 0) + 1
            waiting.grant.set_result(None)

    def _finished(self, client: str) -> None:
        self.stats.finished += 1
        self._release(client)

    def _release(self, client: str) -> None:
        held = self._running.get(client, 0) - 1
        if held > 0:
            self._running[client] = held
        else:
            self._running.pop(client, None)
        self._dispatch()

    def _forget(self, client: str, waiting: _Waiting) -> None:
        queue = self._waiting.get(client)
        if queue is not None and waiting in queue:
            queue.remove(waiting)
            if not queue:
                del self._waiting[client]


def _bound_call(cancel: threading.Event, work: Callable[..., T], args: tuple[Any, ...]) -> T:
    with bound(cancel):
        try:
            return work(*args)
        except BaseException as error:
            _forget_locals(error)
            raise


def _forget_locals(error: BaseException) -> None:
    """Clear the finished frames an error's tracebacks hold (its own and those of the errors it
    was raised from), keeping their file and line. A refused body's error otherwise keeps the body
    and its parsed values alive through those frames, in a reference cycle that only the collector
    frees, and the large-body threads freeze what they made (`proxy.server.threads.collector`):
    twenty 4 MB model names refused with 400 held 160 MB until the next thaw."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)  # a frame still running is left as it is
        pending += (current.__cause__, current.__context__)


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[..., object], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the loop has closed: nothing is left to hand the thread to
        loop.call_soon_threadsafe(callback, *args)


def client_scope(request: web.Request, digest: bytes | None) -> Hashable:
    """The scope of `request`'s client: ("key", `digest`, its credential's: `credential_digest`)
    or ("connection", peer)."""
    if digest is not None:
        return ("key", digest)
    transport = request.transport
    peer = transport.get_extra_info("peername") if transport is not None else None
    return ("connection", str(peer), id(transport))



# Large bodies (above `server.offload_bytes`) are parsed, counted and planned here, off the event
# loop, one per core at a time (more wait their turn), in threads below the loop's priority, with
# the garbage collector kept off their objects (`CollectorPause`): small requests keep their
# latency while 10 MB bodies are counted. See bench/changes.md for the figures. Who gets a thread
# is decided by `FairSlots`: a bounded share per client, fair order, and
# cancellation when the client hangs up.
LARGE_BODY_WORKERS = max(1, min(4, os.cpu_count() or 1))
_LARGE_BODIES = ThreadPoolExecutor(
    max_workers=LARGE_BODY_WORKERS,
    thread_name_prefix="context-guard-large",
    initializer=lower_thread_priority,
)
COLLECTOR_PAUSE = CollectorPause()
_SLOTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, FairSlots] = weakref.WeakKeyDictionary()


def large_body_slots() -> FairSlots:
    """The running loop's share of the large-body threads (one scheduler per loop, one pool per process)."""
    loop = asyncio.get_running_loop()
    slots = _SLOTS.get(loop)
    if slots is None:
        per_client = max(1, LARGE_BODY_WORKERS - 1)
        slots = _SLOTS[loop] = FairSlots(_LARGE_BODIES, LARGE_BODY_WORKERS, per_client)
    return slots


# Bodies with at most this many new bytes are parsed and planned on the event loop: the worst text
# costs about 0.7 microseconds a byte to count (random letters, no spaces; prose: 0.2), so this
# keeps the loop's share of one request to a few milliseconds. Above it and up to
# `server.offload_bytes`, the work runs in the medium-body threads (no collector pause: their
# objects are few); above that, in the large-body threads. Both are shared fairly per client.
INLINE_BYTES = 4 * 1024
MEDIUM_BODY_WORKERS = max(2, min(8, 2 * (os.cpu_count() or 1)))
_MEDIUM_BODIES = ThreadPoolExecutor(max_workers=MEDIUM_BODY_WORKERS, thread_name_prefix="context-guard-medium")
_MEDIUM_SLOTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, FairSlots] = weakref.WeakKeyDictionary()


def medium_body_slots() -> FairSlots:
    """The running loop's share of the medium-body threads."""
    loop = asyncio.get_running_loop()
    slots = _MEDIUM_SLOTS.get(loop)
    if slots is None:
        slots = _MEDIUM_SLOTS[loop] = FairSlots(_MEDIUM_BODIES, MEDIUM_BODY_WORKERS, MEDIUM_BODY_WORKERS - 1)
    return slots


async def near_loop(work: Callable[..., T], *args: Any, size: int, client: str = "") -> T:
    """`work(*args)` for a body with `size` new bytes (at most `server.offload_bytes`): on the loop
    within the inline budget when it is at most `INLINE_BYTES` (a re-sent body's parse walks every
    item: `proxy.core.work_budget.ITEM_UNITS`), else, or when it would overspend, in the
    medium-body threads, within `client`'s share."""
    if size <= INLINE_BYTES:
        try:
            with budgeted(INLINE_BYTES):
                return work(*args)
        except OverBudget:
            pass  # stopped before the step that would overspend: done again in a thread
    return await medium_body_slots().run(client, work, *args)


# A body of at most this many bytes is planned on the loop first, within a budget of `INLINE_BYTES`
# units of new work (characters to encode, file bytes to decode: `proxy.core.work_budget`); the
# rest of a plan (a lookup and a hash per message, the cut) grows with the body, about 1-2 ms a
# MiB. A conversation re-sent with a new turn is planned where it arrived: handing it to a thread
# cost more than planning it (issue 28). A plan that would overspend stops before the step that
# would, and runs again in the medium-body threads, where the counts the first try made are cached.
INLINE_PLAN_BYTES = 1024 * 1024


async def planned_near_loop(work: Callable[..., T], *args: Any, size: int, client: str = "") -> T:
    """`work(*args)` for a plan of a body of `size` bytes (at most `server.offload_bytes` new):
    on the loop within the inline budget when the body is at most `INLINE_PLAN_BYTES`, else (or
    when it overspends) in the medium-body threads, within `client`'s share."""
    if size <= INLINE_PLAN_BYTES:
        try:
            with budgeted(INLINE_BYTES):
                return work(*args)
        except OverBudget:
            pass  # counted so far: cached; the thread goes on from there
    return await medium_body_slots().run(client, work, *args)


async def off_loop(work: Callable[..., T], *args: Any, client: str = "") -> T:
    """`work(*args)` for a large body, in the large-body threads with automatic garbage collection
    paused (as `asyncio.to_thread` does: the caller's context variables, such as the log's bound
    fields, go along), within `client`'s share of the threads (`client_key`).
    Cancelling the caller drops work not started and sets the cancel event of work running."""
    return await large_body_slots().run(client, COLLECTOR_PAUSE.around, work, *args)


async def performed(large: bool, work: Callable[..., T], *args: Any, size: int, client: str) -> T:
    """`work(*args)` for a body: a `large` one (new bytes over `server.offload_bytes`) in the
    large-body threads, else sized by `size` bytes (inline on the loop up to `INLINE_BYTES`, else
    in the medium-body threads); either way within `client`'s share of the threads
    (`client_key`), dropped or cancelled when the client hangs up."""
    if large:
        return await off_loop(work, *args, client=client)
    return await near_loop(work, *args, size=size, client=client)


async def planned(large: bool, work: Callable[..., T], *args: Any, size: int, client: str) -> T:
    """`work(*args)`, a plan of a whole body of `size` bytes: as `performed` for a `large` one;
    else on the loop within a budget of new work, moved to the medium-body threads when the body
    is large or the plan would overspend (`planned_near_loop`)."""
    if large:
        return await off_loop(work, *args, client=client)
    return await planned_near_loop(work, *args, size=size, client=client)
