"""The hooks heavy steps poll: a budget on the work one call may do before it must be done
elsewhere, and cooperative cancellation of work running in a thread whose request is gone.

The server plans a request on the event loop when that is cheap, and in a worker thread when it
is not (`proxy.server.threads.placement`). What a plan costs is not known from the body's size:
a conversation re-sent with a new turn is 88 KB of bytes and a few hundred characters of new
work, since its earlier messages' counts are cached. So the shell runs the plan on the loop
within a budget (`budgeted(units)`, a context variable: only that one call sees it), and each step
whose cost grows with its input spends from it before doing the work: an encoder counting a text
spends its characters, a file part its bytes. When a step would overspend, `spend` raises
`OverBudget` before the work starts; the shell then runs the call again in a thread, where no
budget is bound, and what the first try counted is already in the cache.

Work that grows with the number of a conversation's items rather than their characters (reading
each Responses item, looking each message up, splitting the conversation into turns, the cut)
spends `ITEM_UNITS` per item, once per walk, before it starts: a re-sent 1 MiB body of
one-character items (24,000 of them) costs 150-300 ms of such work with no character to encode.
Work that grows with the content blocks (parts) inside a message, each read by its shape's reader,
hashed and walked by the count and the cut, spends `BLOCK_UNITS` per block the same way: a re-sent
1 MiB message of 31,000 empty text blocks held the loop 160-370 ms before it did.

With no budget bound (threads, tests, the CLI) `spend` is a context-variable read that returns at
once.

A large body's parsing, counting and planning runs in a worker thread
(`proxy.server.threads.placement`). When the client hangs up, the request's coroutine is
cancelled, but a thread cannot be stopped from outside: the work stops itself at its next
checkpoint. The server binds a `threading.Event` to the work's context (`bound(event)`, a context
variable, so only the work of that one request sees it) and sets it when the request is
cancelled; code that loops over slices of work calls `checkpoint()` between slices:

    from proxy.core.work_budget import checkpoint
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
from contextvars import ContextVar, Token

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


_LEFT: ContextVar[list[int] | None] = ContextVar("context_guard_work_left", default=None)


# What reading and planning one item of a conversation costs, in units of the budget: about 20 us
# of work an item (a lookup, a hash, a few objects), as much as encoding 30-100 characters; 16
# keeps a conversation of 94 messages (the warm 88 KB agent conversation) on the loop and moves
# one of more than 256 items to a thread.
ITEM_UNITS = 16
# What reading and planning one content block of a message costs: about 5 us (a dict read, a type
# check, a part of the view), a quarter of an item's. A message of up to a thousand blocks stays on
# the loop.
BLOCK_UNITS = 4


def content_blocks(messages: list[object]) -> int:
    """The content blocks (parts) the view's `messages` hold, for `spend(BLOCK_UNITS * ...)`."""
    return sum(len(content) for m in messages if type(m) is dict and type(content := m.get("content")) is list)


class OverBudget(Exception):  # named for what happened: the work is not done, it is to be done elsewhere
    """The call would do more work than its budget allows; nothing of the step was done."""


def spend(units: int) -> None:
    """Take `units` of work (characters to encode, bytes to decode) from the bound budget; raise
    `OverBudget` when they are more than is left. Without a budget, return at once."""
    left = _LEFT.get()
    if left is None:
        return
    left[0] -= units
    if left[0] < 0:
        raise OverBudget(f"{units} units of work past the budget")


class budgeted:  # used as a function: `with budgeted(units):`
    """Within the block, `spend` takes from a budget of `units`. A class rather than a
    generator-based context manager: it wraps every plan made on the loop."""

    __slots__ = ("_token", "_units")
    _token: Token[list[int] | None]

    def __init__(self, units: int) -> None:
        self._units = units

    def __enter__(self) -> None:
        self._token = _LEFT.set([self._units])

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        _LEFT.reset(self._token)
