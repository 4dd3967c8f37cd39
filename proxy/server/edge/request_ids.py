"""Request ids made without a system call: a random prefix per process and a counter.

`secrets.token_hex(16)` asks the kernel for 16 random bytes on every request (a `getrandom`
call). An id needs to be unique, not secret: 64 random bits drawn once per process (again in a
forked child, whose counter would otherwise repeat its parent's) name the process among every
worker and replica, and a counter names the request within it. The id is written as a UUID
version 4 in 32 hex digits, the form the proxy has always used, so that an upstream that accepts
only UUIDs (llama-cpp-python answers any other `x-request-id` with a 400 and an empty body) takes
it as it is.
"""

from __future__ import annotations

import itertools
import os

# A UUID's version (4) sits in bits 12-15 of its high 64, its variant (RFC 4122: binary 10) in
# the top two of its low 64: the prefix is the high half, the counter takes the other 62 bits, so
# it wraps only after 4.6e18 requests of one process.
_COUNTER_BITS = (1 << 62) - 1
_VARIANT = 0b10 << 62


class RequestIds:
    """A source of ids unique across processes: `next()` is a counter step and one format."""

    def __init__(self) -> None:
        self._reseed()

    def _reseed(self) -> None:
        high = int.from_bytes(os.urandom(8), "big") & ~(0xF << 12) | (4 << 12)
        self._head = f"{high:016x}"
        self._counter = itertools.count(1)

    def next(self) -> str:
        return self._head + format(next(self._counter) & _COUNTER_BITS | _VARIANT, "016x")


REQUEST_IDS = RequestIds()
os.register_at_fork(after_in_child=REQUEST_IDS._reseed)
# A fresh id: 32 hex digits, a UUID version 4, never one this or another process gave. The bound
# method itself, not a function calling it: one call per request.
new_request_id = REQUEST_IDS.next
