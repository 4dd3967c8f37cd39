"""Where a request's work runs: on the event loop, in the medium-body threads or in the large-body threads.

One event loop serves every request of a worker process, so work that grows with a body runs on
it only while it stays small; the rest goes to one of two thread pools, each shared fairly per
client (`proxy.server.threads.slots.FairSlots`: a bounded share, fair order, cancellation when the client
hangs up):

- a **parse** is sized by the body's new bytes (`performed`): up to `INLINE_BYTES` on the loop, up
  to `server.offload_bytes` in the medium-body threads, above that in the large-body threads;
- a **plan** is sized by the work it turns out to need (`planned`): a body of at most
  `INLINE_PLAN_BYTES` is planned on the loop within a budget of new work
  (`proxy.core.work_budget`), and moved to the medium-body threads when it would overspend.
"""

from __future__ import annotations

import asyncio
import os
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from proxy.core.work_budget import OverBudget, budgeted
from proxy.server.threads.collector import CollectorPause
from proxy.server.threads.slots import FairSlots
from proxy.tokenizers.vocabularies import lower_thread_priority

T = TypeVar("T")

# Large bodies (above `server.offload_bytes`) are parsed, counted and planned here, off the event
# loop, one per core at a time (more wait their turn), in threads below the loop's priority, with
# the garbage collector kept off their objects (`CollectorPause`): small requests keep their
# latency while 10 MB bodies are counted. See bench/changes.md for the figures. Who gets a thread
# is decided by `FairSlots` (proxy.server.threads.slots): a bounded share per client, fair order, and
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
    fields, go along), within `client`'s share of the threads (`proxy.server.threads.slots.client_key`).
    Cancelling the caller drops work not started and sets the cancel event of work running."""
    return await large_body_slots().run(client, COLLECTOR_PAUSE.around, work, *args)


async def performed(large: bool, work: Callable[..., T], *args: Any, size: int, client: str) -> T:
    """`work(*args)` for a body: a `large` one (new bytes over `server.offload_bytes`) in the
    large-body threads, else sized by `size` bytes (inline on the loop up to `INLINE_BYTES`, else
    in the medium-body threads); either way within `client`'s share of the threads
    (`proxy.server.threads.slots.client_key`), dropped or cancelled when the client hangs up."""
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
