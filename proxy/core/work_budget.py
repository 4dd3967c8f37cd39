"""A budget on the work one call may do before it must be done elsewhere: the hook heavy steps spend from.

The server plans a request on the event loop when that is cheap, and in a worker thread when it
is not (`proxy.server.placement`). What a plan costs is not known from the body's size:
a conversation re-sent with a new turn is 88 KB of bytes and a few hundred characters of new
work, since its earlier messages' counts are cached. So the shell runs the plan on the loop
within a budget (`budgeted(units)`, a context variable: only that one call sees it), and each step
whose cost grows with its input spends from it before doing the work: an encoder counting a text
spends its characters, a file part its bytes. When a step would overspend, `spend` raises
`OverBudget` before the work starts; the shell then runs the call again in a thread, where no
budget is bound, and what the first try counted is already in the cache.

With no budget bound (threads, tests, the CLI) `spend` is a context-variable read that returns at
once. Pure: no I/O, no logging.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

_LEFT: ContextVar[list[int] | None] = ContextVar("context_guard_work_left", default=None)


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


@contextlib.contextmanager
def budgeted(units: int) -> Iterator[None]:
    """Within the block, `spend` takes from a budget of `units`."""
    token = _LEFT.set([units])
    try:
        yield
    finally:
        _LEFT.reset(token)
