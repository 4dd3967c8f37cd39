"""Whole-buffer operations on large bytes done a slice at a time, so that no one call holds the GIL long.

A serving process's event loop shares the GIL with the threads that read and count large bodies.
A C call such as `bytes.count`, `bytes.find` or `hash(bytes)` holds the GIL from start to end:
on a 31 MiB body, 18-55 ms, and the loop (and with it `/livez`) waits that long each time it
needs the GIL back, several times per answer. Done here in slices of `SLICE_BYTES` with a Python
step between them, the loop waits at most one slice (well under a millisecond) once the
interpreter asks the thread to let go. The answers are the whole-buffer ones; below
`SLICE_BYTES` the whole-buffer call is made as it is (no added work for small bodies).

The hash of large bytes that keys the count cache is `proxy.core.counting.request_count.digest`
(BLAKE2b, which lets go of the GIL while it hashes a large buffer).
"""

from __future__ import annotations

SLICE_BYTES = 1024 * 1024


def count(data: bytes, byte: bytes) -> int:
    """`data.count(byte)` for a single `byte`, a slice at a time."""
    if len(byte) != 1:
        raise ValueError("count takes a single byte: a longer pattern could straddle two slices")
    if len(data) <= SLICE_BYTES:
        return data.count(byte)
    return sum(data.count(byte, start, start + SLICE_BYTES) for start in range(0, len(data), SLICE_BYTES))


def contains(data: bytes, pattern: bytes) -> bool:
    """`pattern in data`, a slice at a time (slices overlap by `len(pattern) - 1` bytes)."""
    if len(data) <= SLICE_BYTES or not pattern:
        return pattern in data
    reach = SLICE_BYTES + len(pattern) - 1
    return any(data.find(pattern, start, start + reach) >= 0 for start in range(0, len(data), SLICE_BYTES))

