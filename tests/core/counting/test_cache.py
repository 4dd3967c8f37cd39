"""The count cache: a re-sent conversation costs only its new messages; memory stays bounded."""

from __future__ import annotations

import gc
import tracemalloc

from proxy.core.counting.count_cache import CountCache, entry_bytes
from proxy.core.counting.request_count import RequestCounter
from proxy.core.counting.tokenizer import EncoderTokenizer
from tests.support.counting_tokenizer import CountingTokenizer


def _conversation(turns: int) -> list[dict[str, str]]:
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i} " + "word " * 200}
        for i in range(turns)
    ]


class TestCountCache:
    def test_a_resent_conversation_encodes_only_its_new_message(self, registry):
        tokenizer, cache = CountingTokenizer(), CountCache()
        counter = RequestCounter(registry.profile("gpt-4o"), tokenizer, cache)
        first = counter.request({"messages": _conversation(20)}).total
        tokenizer.encoded_chars = 0
        messages = _conversation(21)
        second = counter.request({"messages": messages}).total
        assert second > first
        assert tokenizer.encoded_chars < 2 * len(messages[-1]["content"])
        assert cache.hits >= 20

    def test_an_edited_message_is_recounted_not_served_stale(self, registry, tokenizers):
        profile = registry.profile("gpt-4o")
        cache = CountCache()
        counter = RequestCounter(profile, tokenizers.get(profile.tokenizer), cache)
        messages = _conversation(4)
        before = counter.request({"messages": messages}).total
        messages[1] = {**messages[1], "content": messages[1]["content"] + " and several more words here"}
        assert counter.request({"messages": messages}).total == before + 5

    def test_types_are_part_of_the_key(self, registry, tokenizers):
        profile = registry.profile("gpt-4o")
        counter = RequestCounter(profile, tokenizers.get(profile.tokenizer), CountCache())
        as_int = counter.request({"messages": [{"role": "user", "content": "x", "weight": 1}]})
        as_text = counter.request({"messages": [{"role": "user", "content": "x", "weight": "1 1 1 1 1"}]})
        assert as_int.total != as_text.total

    def test_cached_and_uncached_counts_agree(self, registry, tokenizers):
        profile = registry.profile("gpt-4o")
        tokenizer = tokenizers.get(profile.tokenizer)
        body = {"messages": _conversation(10)}
        cached = RequestCounter(profile, tokenizer, CountCache())
        assert (
            cached.request(body).total
            == cached.request(body).total
            == RequestCounter(profile, tokenizer).request(body).total
        )

    def test_memory_is_bounded_by_the_entry_limit(self):
        cache = CountCache(max_entries=5, min_chars=1)
        tokenizer = EncoderTokenizer("words", str.split)
        for i in range(50):
            cache.count(tokenizer, f"text number {i}")
        assert len(cache) == 5

    def test_keys_do_not_hold_message_content(self):
        cache = CountCache(min_chars=1)
        cache.count(EncoderTokenizer("words", str.split), "a secret the cache must not keep")
        assert all(isinstance(digest, bytes) and len(digest) == 16 for _, digest in cache._entries)

    def test_entries_are_per_tokenizer(self):
        cache = CountCache(min_chars=1)
        a, b = EncoderTokenizer("words", str.split), EncoderTokenizer("chars", list)
        assert cache.count(a, "two words") == 2
        assert cache.count(b, "two words") == 9


def _conversations(registry, cache: CountCache, count: int, turns: int = 20) -> None:
    """Count `count` different conversations of `turns` messages through `cache`."""
    counter = RequestCounter(registry.profile("gpt-4o"), CountingTokenizer(), cache)
    for n in range(count):
        messages = [{**m, "content": f"conversation {n} {m['content']}"} for m in _conversation(turns)]
        counter.request({"messages": messages})


class TestCountCacheMemory:
    def test_memory_is_bounded_by_the_byte_limit(self, registry):
        cache = CountCache(max_bytes=64 * 1024)
        _conversations(registry, cache, 100)
        assert 0 < cache.bytes <= 64 * 1024
        assert cache.misses > len(cache)  # it evicted to stay within the limit

    def test_its_byte_total_is_that_of_the_entries_it_holds(self, registry):
        cache = CountCache(max_bytes=64 * 1024)
        _conversations(registry, cache, 100)
        _conversations(registry, cache, 10)  # re-sent: hits move entries, nothing is counted twice
        assert cache.bytes == sum(cache.entry_bytes(key, value) for key, value in cache._entries.items())

    def test_the_estimate_is_at_least_what_the_entries_really_hold(self, registry):
        cache = CountCache(max_entries=10**9, max_bytes=10**12)
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            _conversations(registry, cache, 300)
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert len(cache) > 5_000 and held <= cache.bytes

    def test_a_value_that_says_what_it_weighs_is_taken_at_its_word(self):
        class Weighed:
            footprint = 10_000

        cache = CountCache(max_bytes=25_000)
        for i in range(3):
            cache.put(("weighed", i), Weighed())
        assert len(cache) == 2 and cache.bytes >= 20_000

    def test_the_openings_of_re_sent_conversations_are_held_to_the_bound_too(self, registry):
        from proxy.core.counting.count_cache import Opening

        cache = CountCache(max_bytes=64 * 1024)
        profile, tokenizer = registry.profile("gpt-4o"), CountingTokenizer()
        for n in range(40):
            messages = [{**m, "content": f"conversation {n} {m['content']}"} for m in _conversation(20)]
            for turn in (18, 19, 20):  # re-sent with a turn more each time: its openings are kept
                keys = tuple(hash(repr(m)) for m in messages[:turn])
                RequestCounter(profile, tokenizer, cache, keys).request({"messages": messages[:turn]})
        assert any(isinstance(value, Opening) for value in cache._entries.values())
        assert cache.bytes <= 64 * 1024
        assert cache.bytes == sum(cache.entry_bytes(key, value) for key, value in cache._entries.items())

    def test_the_least_recently_used_entry_goes_first(self):
        tokenizer = EncoderTokenizer("words", str.split)
        texts = [f"text number {i}" for i in range(3)]
        one_entry = entry_bytes(CountCache.key(tokenizer, texts[0]), 3)
        cache = CountCache(min_chars=1, max_bytes=3 * one_entry)
        for text in texts:
            cache.count(tokenizer, text)
        cache.count(tokenizer, texts[0])  # used again: now the most recent
        cache.count(tokenizer, "text number 3")
        kept = set(cache._entries)
        assert CountCache.key(tokenizer, texts[0]) in kept and CountCache.key(tokenizer, texts[1]) not in kept

    def test_the_messages_a_request_reads_again_outlive_older_entries(self):
        cache = CountCache(max_entries=3)
        for i in range(3):
            cache.put(("message", i), i)
        assert cache.get_many([("message", 0), None, ("message", 9)]) == [0, None, None]
        cache.put(("message", 3), 3)
        assert list(cache._entries) == [("message", 2), ("message", 0), ("message", 3)]
        assert cache.bytes == sum(cache.entry_bytes(k, v) for k, v in cache._entries.items())

    def test_a_limit_of_zero_bytes_caches_nothing(self, registry):
        cache = CountCache(max_bytes=0)
        _conversations(registry, cache, 3)
        assert len(cache) == 0 and cache.bytes == 0


def _tools(description: str) -> list[dict[str, object]]:
    parameters = {"type": "object", "properties": {"q": {"type": "string", "description": description}}}
    return [{"type": "function", "function": {"name": "search", "description": description, "parameters": parameters}}]


class TestToolDefinitionsCache:
    def test_the_same_tool_definitions_re_sent_are_not_encoded_again(self, registry):
        tokenizer, cache = CountingTokenizer(), CountCache()
        counter = RequestCounter(registry.profile("gpt-4o"), tokenizer, cache)
        body = {"messages": _conversation(2), "tools": _tools("Search the web for pages. " * 20)}
        first = counter.request(body)
        tokenizer.encoded_chars = 0
        again = counter.request({**body, "messages": _conversation(2)})
        assert tokenizer.encoded_chars == 0
        assert again.components["tool_definitions"] == first.components["tool_definitions"] > 0

    def test_changed_tool_definitions_or_tool_choice_are_counted_afresh(self, registry, tokenizers):
        profile = registry.profile("gpt-4o")
        cached = RequestCounter(profile, tokenizers.get(profile.tokenizer), CountCache())
        fresh = RequestCounter(profile, tokenizers.get(profile.tokenizer))
        base = {"messages": _conversation(2), "tools": _tools("Search the web.")}
        forced = {**base, "tool_choice": {"type": "function", "function": {"name": "search"}}}
        edited = {**base, "tools": _tools("Search the web and the intranet, then rank the results.")}
        for body in (base, forced, edited):
            assert cached.request(body).total == fresh.request(body).total


class TestShortStrings:
    def test_roles_are_encoded_once_across_requests_that_share_a_cache(self, registry):
        tokenizer, cache = CountingTokenizer(), CountCache()
        profile = registry.profile("gpt-4o")
        for i in range(3):  # each message new: counted, not taken whole from the cache
            RequestCounter(profile, tokenizer, cache).request({"messages": [{"role": "user", "content": f"hi {i}"}]})
        assert tokenizer.encoded_chars == 3 * len("hi 0") + len("user")

    def test_only_short_strings_are_remembered_and_only_so_many(self, registry):
        tokenizer, cache = CountingTokenizer(), CountCache()
        profile = registry.profile("gpt-4o")
        names = [f"agent-{i}" for i in range(5000)] + ["n" * 65]
        for name in names:
            RequestCounter(profile, tokenizer, cache).request({"messages": [{"role": "user", "name": name}]})
        remembered = cache.short_counts(tokenizer)
        assert len(remembered) == 4096 and "n" * 65 not in remembered
