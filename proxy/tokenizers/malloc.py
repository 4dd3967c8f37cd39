"""The C allocator's two settings that the serving process's memory depends on (glibc only;
elsewhere both do nothing and the process runs as it would anyway).

- `one_arena()`: every thread allocates from the main malloc arena. glibc gives each thread
  that is not the main one an arena of its own, up to eight a core: the vocabulary loaded on a
  thread after start (tens of MB that stay) took 4.5 MB more resident memory in an arena of its
  own than in the main one, where start-up had left room. Threads here do little allocating
  at once (Python holds the GIL; tiktoken's encode threads allocate from their per-thread
  cache), and counting on the encode pool measured no slower with one arena (bench/changes.md).
- `return_freed_memory()`: hand the heap freed by a large load back to the OS (glibc keeps it).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
from typing import Any

_M_ARENA_MAX = -8  # mallopt's parameter: how many arenas threads may use


def one_arena() -> bool:
    """Call before the process starts any thread; True when the allocator took the setting."""
    libc = _libc()
    return libc is not None and hasattr(libc, "mallopt") and libc.mallopt(_M_ARENA_MAX, 1) == 1


def return_freed_memory() -> None:
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


@functools.cache
def _libc() -> Any:
    with contextlib.suppress(OSError):
        return ctypes.CDLL(None)
    return None
