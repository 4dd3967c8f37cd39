"""The C allocator's settings for the serving process (glibc; elsewhere they do nothing)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

# A thread that allocates (100 KB blocks: from an arena, below glibc's mmap threshold), then
# glibc's own report of its arenas on stderr.
_THREAD_ALLOCATES = """
import ctypes, sys, threading
from proxy.tokenizers.malloc import one_arena
took = one_arena() if sys.argv[1] == "one" else None
kept = []
thread = threading.Thread(target=lambda: kept.extend(bytearray(100_000) for _ in range(50)))
thread.start(); thread.join()
ctypes.CDLL(None).malloc_stats()
print(took)
"""

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="arenas are glibc's")


def arenas(mode: str) -> tuple[int, str]:
    out = subprocess.run([sys.executable, "-c", _THREAD_ALLOCATES, mode], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return sum(line.startswith("Arena ") for line in out.stderr.splitlines()), out.stdout.strip()


@glibc
def test_with_one_arena_a_thread_allocates_from_the_main_one():
    assert arenas("one") == (1, "True")


@glibc
def test_without_it_glibc_gives_the_thread_an_arena_of_its_own():
    assert arenas("default") == (2, "None")

