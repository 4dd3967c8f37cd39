"""The ledger of what the provider holds: kept in the learned-state store, per upstream and client,
bounded and expiring like the rest of it."""

from __future__ import annotations

import pytest

from proxy.state import MemoryStore
from proxy.state.store import ANONYMOUS, HELD_TTL_SECONDS, HeldLedger, HeldSize, client_of
from tests.support.clock import ManualClock


class TestHeldLedger:
    async def test_what_one_client_was_told_is_found_again_by_it(self):
        ledger = HeldLedger(MemoryStore())
        await ledger.put("openai", "alice", ("response", "resp_1", 4_200))
        assert await ledger.get("openai", "alice", "response", "resp_1") == HeldSize(4_200)

    async def test_another_client_naming_the_same_id_finds_nothing(self):
        ledger = HeldLedger(MemoryStore())
        await ledger.put("openai", "alice", ("response", "resp_1", 4_200))
        assert await ledger.get("openai", "mallory", "response", "resp_1") is None

    async def test_another_upstream_or_kind_finds_nothing(self):
        ledger = HeldLedger(MemoryStore())
        await ledger.put("openai", "alice", ("response", "resp_1", 4_200))
        assert await ledger.get("azure", "alice", "response", "resp_1") is None
        assert await ledger.get("openai", "alice", "conversation", "resp_1") is None

    async def test_a_cache_is_kept_until_the_provider_lets_it_go(self):
        clock = ManualClock()
        store = MemoryStore(clock=clock)
        ledger = HeldLedger(store, clock=clock)
        await ledger.put("gemini", "alice", ("cache", "cachedContents/a", 20_000), expires_at=clock() + 60)
        assert await ledger.get("gemini", "alice", "cache", "cachedContents/a") == HeldSize(20_000)
        clock.advance(61)
        assert await ledger.get("gemini", "alice", "cache", "cachedContents/a") is None

    async def test_an_expired_cache_is_not_kept_at_all(self):
        clock = ManualClock()
        ledger = HeldLedger(MemoryStore(clock=clock), clock=clock)
        await ledger.put("gemini", "alice", ("cache", "cachedContents/a", 20_000), expires_at=clock() - 1)
        assert await ledger.get("gemini", "alice", "cache", "cachedContents/a") is None

    async def test_entries_expire_after_a_week_and_the_store_stays_bounded(self):
        clock = ManualClock()
        store = MemoryStore(max_entries=3, clock=clock)
        ledger = HeldLedger(store, clock=clock)
        for n in range(5):
            await ledger.put("openai", "alice", ("response", f"resp_{n}", n))
        assert len(store) == 3
        clock.advance(HELD_TTL_SECONDS + 1)
        assert await ledger.get("openai", "alice", "response", "resp_4") is None

    @pytest.mark.parametrize(("kind", "ident"), [("model", "resp_1"), ("response", ""), ("response", "r" * 513)])
    async def test_kinds_and_ids_no_provider_has_are_never_kept(self, kind, ident):
        store = MemoryStore()
        await HeldLedger(store).put("openai", "alice", (kind, ident, 5))
        assert len(store) == 0

    async def test_a_value_another_version_wrote_is_nothing(self):
        store = MemoryStore()
        ledger = HeldLedger(store)
        key = ledger.key("openai", "alice", "response", "resp_1")
        assert key is not None
        await store.put(key, {"tokens": "many"}, 60)
        assert await ledger.get("openai", "alice", "response", "resp_1") is None


class TestClientOf:
    def test_a_credential_is_named_by_a_digest_of_its_digest(self):
        digest = bytes(range(16))
        assert client_of(digest) == client_of(bytes(range(16))) != client_of(bytes(16))
        assert digest.hex() not in client_of(digest)

    def test_no_credential_is_anonymous(self):
        assert client_of(None) == ANONYMOUS
