"""Whole-buffer operations on large bytes done a slice at a time, so that no one call holds the GIL long.

A serving process's event loop shares the GIL with the threads that read and count large bodies.
A C call such as `bytes.count`, `bytes.find` or `hash(bytes)` holds the GIL from start to end:
on a 31 MiB body, 18-55 ms, and the loop (and with it `/livez`) waits that long each time it
needs the GIL back, several times per answer. Done here in slices of `SLICE_BYTES` with a Python
step between them, the loop waits at most one slice (well under a millisecond) once the
interpreter asks the thread to let go. The answers are the whole-buffer ones; below
`SLICE_BYTES` the whole-buffer call is made as it is (no added work for small bodies).

`digest` is the one hash of bytes that keys the count cache and the prefix reader's elements
(`proxy.wire.array_bytes`, `proxy.core.counting.request_count`): `hash()` up to `SLICE_BYTES`, as
before; above, BLAKE2b (which lets go of the GIL while it hashes a large buffer) read as an integer.
Equal bytes give equal digests whichever module takes them, which is all the keys need.
"""

from __future__ import annotations

import hashlib

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


def digest(data: bytes) -> int:
    """A hash of `data` for keys: `hash(data)` up to `SLICE_BYTES`, BLAKE2b's 8 bytes above it."""
    if len(data) <= SLICE_BYTES:
        return hash(data)
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)
