"""Learned state in this process's memory: bounded (least recently used goes first) and expiring."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from proxy.state.store import StateKey, StateStatus, Value


class MemoryStore:
    def __init__(self, max_entries: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, not {max_entries}")
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[StateKey, tuple[Value, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def peek(self, key: StateKey) -> Value | None:
        """`get` without awaiting: for callers (and the Redis store's fallback) on the hot path."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        value, expires = entry
        if expires <= self._clock():
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return value

    def store(self, key: StateKey, value: Value, ttl_seconds: float) -> None:
        """`put` without awaiting."""
        if ttl_seconds <= 0:
            self._entries.pop(key, None)
            return
        self._entries[key] = (value, self._clock() + ttl_seconds)
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    async def get(self, key: StateKey) -> Value | None:
        return self.peek(key)

    async def put(self, key: StateKey, value: Value, ttl_seconds: float) -> None:
        self.store(key, value, ttl_seconds)

    def status(self) -> StateStatus:
        return StateStatus(backend="memory", shared=False, fallbacks=0, errors=0, last_error=None)

    async def open(self) -> None:
        pass  # nothing to connect to

    async def close(self) -> None:
        self._entries.clear()
