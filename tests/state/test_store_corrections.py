"""Self-corrections through the state store: what one replica learns, another applies."""

from __future__ import annotations

from proxy.core.learning.corrections import Correction
from proxy.state import MemoryStore, StateKey
from proxy.state.redis import RedisStore
from proxy.state.store import SharedCorrections, StateOptions

TIGHT, LOOSE = Correction(7000, 1.2, "openai"), Correction(7500, 1.1, "openai")


class TestSharedCorrections:
    async def test_a_correction_remembered_through_one_is_got_through_another_on_the_same_store(self):
        store = MemoryStore()
        await SharedCorrections(store, 60).remember("openai", "gpt-4o", TIGHT)
        assert await SharedCorrections(store, 60).get("openai", "gpt-4o") == TIGHT

    async def test_corrections_are_kept_per_upstream(self):
        shared = SharedCorrections(MemoryStore(), 60)
        await shared.remember("openai", "gpt-4o", TIGHT)
        assert await shared.get("azure", "gpt-4o") is None

    async def test_a_looser_correction_keeps_the_tighter_one_stored(self):
        shared = SharedCorrections(MemoryStore(), 60)
        await shared.remember("openai", "gpt-4o", TIGHT)
        assert await shared.remember("openai", "gpt-4o", LOOSE) == TIGHT
        assert await shared.get("openai", "gpt-4o") == TIGHT

    async def test_a_malformed_stored_value_counts_as_none(self):
        store = MemoryStore()
        await store.put(StateKey("correction", "openai", "gpt-4o"), {"window": "big"}, 60)
        assert await SharedCorrections(store, 60).get("openai", "gpt-4o") is None

    async def test_a_correction_in_this_process_s_memory_is_held_without_awaiting(self):
        shared = SharedCorrections(MemoryStore(), 60)
        await shared.remember("openai", "gpt-4o", TIGHT)
        assert shared.held("openai", "gpt-4o") == (True, TIGHT) and shared.held("openai", "gpt-4") == (True, None)

    def test_a_store_elsewhere_is_not_held_and_must_be_asked(self):
        elsewhere = RedisStore(StateOptions(url="redis://127.0.0.1:9/0"))  # never connected: not awaited
        assert SharedCorrections(elsewhere, 60).held("openai", "gpt-4o") == (False, None)
