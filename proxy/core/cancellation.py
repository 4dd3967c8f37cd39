"""Cooperative cancellation of work running in a thread: the hook long loops poll.

The server runs a large body's parsing, counting and planning in a worker thread
(`proxy.server.threads.placement`). When the client hangs up, the request's coroutine is cancelled, but a
thread cannot be stopped from outside: the work stops itself at its next checkpoint. The server
binds a `threading.Event` to the work's context (`bound(event)`, a context variable, so only the
work of that one request sees it) and sets it when the request is cancelled; code that loops over
slices of work calls `checkpoint()` between slices:

    from proxy.core.cancellation import checkpoint
    for piece in slices(text):
        checkpoint()          # raises WorkCancelled once the request is gone
        total += count(piece)

Outside such a thread (tests, the event loop, the CLI) no event is bound and `checkpoint()` is a
context-variable read that returns at once. Pure: no I/O, no logging.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextvars import ContextVar

_EVENT: ContextVar[threading.Event | None] = ContextVar("context_guard_cancel", default=None)


class WorkCancelled(Exception):  # named for what happened, as asyncio's CancelledError
    """The request this work was for is gone (its client hung up): stop, nothing will read the result."""


def checkpoint() -> None:
    """Raise `WorkCancelled` when the current work's request was cancelled; else return at once."""
    event = _EVENT.get()
    if event is not None and event.is_set():
        raise WorkCancelled("the request was cancelled")


def cancelled() -> bool:
    """Whether the current work's request was cancelled (for loops that prefer to stop quietly)."""
    event = _EVENT.get()
    return event is not None and event.is_set()


def current_event() -> threading.Event | None:
    """The event bound to the current work, if any (to hand to code that polls it directly)."""
    return _EVENT.get()


@contextlib.contextmanager
def bound(event: threading.Event) -> Iterator[threading.Event]:
    """Within the block, `checkpoint()` watches `event`."""
    token = _EVENT.set(event)
    try:
        yield event
    finally:
        _EVENT.reset(token)
