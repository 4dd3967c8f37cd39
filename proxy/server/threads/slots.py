"""Large-body work off the event loop, shared fairly between clients, and stopped when its client leaves.

A body with more new bytes than `server.offload_bytes` is parsed, counted and planned in a worker
thread: one per core, at most four (more would only contend for the GIL). Threads are few, so who
gets one is decided here, on the event loop, not by the executor's first-come queue:

- **Per client, a bounded share.** One client holds at most `per_client` threads at once
  (`workers - 1`, at least 1): a client sending several large bodies queues behind itself while
  another client's body takes the thread left free. A client is its credential (the first of
  `Authorization`, `x-api-key`, `api-key`, hashed: the key never stays in memory as such), or the
  connection's peer address when it sends none.
- **Fair order.** When a thread frees, the waiting job of the client with the fewest threads
  goes next (the oldest such job on a tie), so a client with many large bodies waiting does not
  starve one with a single body.
- **Cancellation.** When the request's coroutine is cancelled (aiohttp cancels the handler when
  the client hangs up), a job not started yet is dropped from the queue and never runs; a job
  running is told through the `threading.Event` bound to its context
  (`proxy.core.cancellation`): counting that works in slices calls
  `proxy.core.cancellation.checkpoint()` between slices and stops. The thread is counted as held
  until the work has really returned, so a client that hangs up cannot free its share early and
  take another.

Jobs run with the caller's context variables (the log's bound fields), like `asyncio.to_thread`.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import threading
import traceback
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from proxy.core.cancellation import bound

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
