"""The learned-state interface: keys, options, and the in-memory store."""

from __future__ import annotations

import pytest

from proxy.state import MemoryStore, StateKey, StateOptions, open_store
from tests.support.clock import ManualClock


class TestStateKey:
    def test_a_key_is_namespaced_by_kind_upstream_and_model(self):
        assert StateKey("correction", "openai", "gpt-4o").render("cg") == "cg:correction:openai:gpt-4o"

    def test_colons_in_a_model_name_cannot_collide_with_another_key(self):
        fine_tuned = StateKey("correction", "openai", "ft:gpt-4o-mini:org::abc").render("cg")
        assert fine_tuned == "cg:correction:openai:ft%3Agpt-4o-mini%3Aorg%3A%3Aabc"
        assert StateKey("correction", "openai:ft", "gpt-4o").render("cg") != StateKey(
            "correction", "openai", "ft:gpt-4o"
        ).render("cg")

    def test_every_part_is_required(self):
        with pytest.raises(ValueError, match="non-empty model"):
            StateKey("correction", "openai", "")


class TestStateOptions:
    @pytest.mark.parametrize(
        ("options", "message"),
        [
            ({"url": "http://localhost:6379"}, "state.url must start with redis://"),
            ({"deadline_ms": 0}, "state.deadline_ms must be between 1 and 10000"),
            ({"local_cache_seconds": -1}, "state.local_cache_seconds must be between 0 and 3600"),
            ({"retry_seconds": 0}, "state.retry_seconds must be above 0"),
            ({"namespace": "a:b"}, "state.namespace must be a non-empty name without ':'"),
        ],
    )
    def test_a_bad_value_is_refused_naming_the_key(self, options, message):
        with pytest.raises(ValueError, match=message):
            StateOptions(**options)

    def test_without_a_url_state_stays_in_this_process(self):
        store = open_store(StateOptions())
        assert isinstance(store, MemoryStore) and store.status().backend == "memory"

    def test_with_a_url_state_goes_to_redis(self):
        store = open_store(StateOptions(url="redis://127.0.0.1:1/0"))
        assert store.status().backend == "redis" and store.status().shared


class TestMemoryStore:
    async def test_a_value_put_is_got_back(self):
        store, key = MemoryStore(), StateKey("calibration", "vllm", "llama")
        await store.put(key, {"ratio": 1.07}, ttl_seconds=60)
        assert await store.get(key) == {"ratio": 1.07}

    async def test_a_value_expires_after_its_ttl(self):
        clock = ManualClock()
        store, key = MemoryStore(clock=clock), StateKey("correction", "openai", "gpt-4o")
        await store.put(key, 1, ttl_seconds=10)
        clock.now += 9.9
        assert await store.get(key) == 1
        clock.now += 0.2
        assert await store.get(key) is None and len(store) == 0

    async def test_the_least_recently_used_value_goes_first_when_full(self):
        store = MemoryStore(max_entries=2)
        a, b, c = (StateKey("correction", "u", m) for m in "abc")
        await store.put(a, 1, 60)
        await store.put(b, 2, 60)
        await store.get(a)
        await store.put(c, 3, 60)
        assert [await store.get(k) for k in (a, b, c)] == [1, None, 3]

    async def test_a_zero_ttl_removes_the_value(self):
        store, key = MemoryStore(), StateKey("correction", "u", "m")
        await store.put(key, 1, 60)
        await store.put(key, 1, 0)
        assert await store.get(key) is None
