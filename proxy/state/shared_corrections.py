"""Self-corrections kept in a `StateStore`, so every replica applies what one of them learned.

The request path reads a model's correction before planning and remembers a new one after an
upstream's context-length error; both go through the store, keyed by upstream and model (two
upstreams serving one model name can count differently). A stored correction only ever gets
tighter: remembering a looser one keeps the stored one.
"""

from __future__ import annotations

from typing import Any

from proxy.core.learning.corrections import Correction
from proxy.state.memory import MemoryStore
from proxy.state.store import StateKey, StateStore

KIND = "correction"


class SharedCorrections:
    def __init__(self, store: StateStore, ttl_seconds: float) -> None:
        self.store = store
        self.ttl_seconds = ttl_seconds

    def held(self, upstream: str, model: str) -> tuple[bool, Correction | None]:
        """`get` without awaiting when the store is this process's memory: (True, the correction
        or None); (False, None) when only `get` can say."""
        store = self.store
        if isinstance(store, MemoryStore):
            return True, _correction(store.peek(StateKey(KIND, upstream, model))) if len(store) else None
        return False, None

    async def get(self, upstream: str, model: str) -> Correction | None:
        return _correction(await self.store.get(StateKey(KIND, upstream, model)))

    async def remember(self, upstream: str, model: str, correction: Correction) -> Correction:
        """Store `correction` unless a tighter one is already stored; the one that applies now."""
        key = StateKey(KIND, upstream, model)
        stored = _correction(await self.store.get(key))
        kept = correction if stored is None or correction.window <= stored.window else stored
        await self.store.put(key, kept.to_dict(), self.ttl_seconds)
        return kept


def _correction(value: Any) -> Correction | None:
    """A stored value back as a Correction; anything malformed (another version wrote it) is none."""
    return Correction.from_dict(value) if isinstance(value, dict) else None
