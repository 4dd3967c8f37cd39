"""Learned state (self-corrections, calibration ratios) behind one small interface.

`StateStore` is all the rest of the proxy sees: `get(key)` and `put(key, value, ttl_seconds)`.
Two implementations: `MemoryStore` (this process only, bounded and expiring; the default) and
`RedisStore` (shared by every replica, with a short local read cache and a deadline, falling
back to local state whenever Redis is slow or down). `open_store(options)` picks one.

Values are small JSON-serialisable data (a number, a mapping of numbers). Keys name a kind, an
upstream and a model, so two upstreams serving the same model name never share a correction.
"""

from __future__ import annotations

from proxy.state.store import MemoryStore, StateKey, StateOptions, StateStatus, StateStore, Value


def open_store(options: StateOptions, log: object | None = None) -> StateStore:
    """The store `options` ask for: Redis when `url` is set, else this process's memory."""
    if options.url is None:
        return MemoryStore(max_entries=options.max_local_entries)
    from proxy.state.redis import RedisStore  # redis-py is imported only when it is used

    return RedisStore(options, log=log)


__all__ = ["MemoryStore", "StateKey", "StateOptions", "StateStatus", "StateStore", "Value", "open_store"]
