"""Openings: a request that shares its first messages with one counted before carries their
counts, and its count is the count of the same request counted from nothing."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.counting.count_cache import LOOKED_UP, CountCache, Opening, sizes_to_keep, sizes_to_look_up
from proxy.core.counting.count_rules import RequestCount
from proxy.core.counting.request_count import RequestCounter
from tests.support.counting_tokenizer import CountingTokenizer

MODELS = ("gpt-4o", "gpt-4-0613")  # today's framing, and the measured parallel-call framing


def hashes(messages: list[dict[str, Any]]) -> tuple[int, ...]:
    """What the prefix reader gives for a compactly written body."""
    return tuple(hash(orjson.dumps(m)) for m in messages)


def call(call_id: str, name: str = "lookup") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": '{"q": 1}'}}


def calls(*ids: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [call(i) for i in ids]}


def result(call_id: str, text: str = "found it") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


SYSTEM = {"role": "system", "content": "You look things up."}
REMOTE_IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}


def fresh(registry, tokenizers, model: str, messages: list[dict[str, Any]]) -> RequestCount:
    profile = registry.profile(model)
    return RequestCounter(profile, tokenizers.get(profile.tokenizer)).request({"model": model, "messages": messages})


def shared(earlier: list[dict[str, Any]], messages: list[dict[str, Any]]) -> int:
    """What the prefix reader says a body holds of the one before: its first messages, as far
    as they are the same."""
    same = 0
    for a, b in zip(hashes(earlier), hashes(messages), strict=False):  # the shorter one ends it
        if a != b:
            break
        same += 1
    return same


def in_turn(registry, tokenizers, model: str, *requests: list[dict[str, Any]]) -> RequestCount:
    """The last request's count, the ones before it counted first with the same cache."""
    profile = registry.profile(model)
    cache = CountCache()
    count, earlier = None, []
    for messages in requests:
        counter = RequestCounter(
            profile, tokenizers.get(profile.tokenizer), cache, hashes(messages), shared(earlier, messages)
        )
        count = counter.request({"model": model, "messages": messages})
        earlier = messages
    assert count is not None
    return count


@pytest.mark.parametrize("model", MODELS)
class TestCarriedCounts:
    def test_a_turn_appended_counts_as_the_whole_request_counted_anew(self, model, registry, tokenizers):
        first = [SYSTEM, user("find a"), calls("c1"), result("c1"), assistant("a is found")]
        second = [*first, user("and b?")]
        assert in_turn(registry, tokenizers, model, first, second) == fresh(registry, tokenizers, model, second)

    def test_the_last_turn_replaced_counts_as_the_whole_request_counted_anew(self, model, registry, tokenizers):
        first = [SYSTEM, user("find a"), assistant("done"), user("now b")]
        second = [*first[:2], assistant("done, twice"), user("now c")]
        assert in_turn(registry, tokenizers, model, first, second) == fresh(registry, tokenizers, model, second)

    def test_a_result_that_joins_a_parallel_call_of_the_opening_moves_its_marks(self, model, registry, tokenizers):
        first = [SYSTEM, user("find a and b"), calls("c1", "c2"), result("c1")]
        second = [*first, result("c2", "b is here")]
        assert in_turn(registry, tokenizers, model, first, second) == fresh(registry, tokenizers, model, second)

    def test_a_call_id_made_again_later_answers_the_results_after_it(self, model, registry, tokenizers):
        first = [SYSTEM, user("q"), calls("c1"), result("c1"), user("again")]
        second = [*first, {"role": "assistant", "content": None, "tool_calls": [call("c1", "other")]}, result("c1")]
        assert in_turn(registry, tokenizers, model, first, second) == fresh(registry, tokenizers, model, second)

    def test_the_latest_user_message_moves_into_the_opening_when_none_follows(self, model, registry, tokenizers):
        first = [SYSTEM, user("one"), assistant("two"), user("three")]
        second = [*first, assistant("four")]
        count = in_turn(registry, tokenizers, model, first, second)
        assert count == fresh(registry, tokenizers, model, second)
        assert count.components["latest_user"] > 0

    def test_the_opening_carries_its_notes_images_and_pinned_messages(self, model, registry, tokenizers):
        first = [SYSTEM, {"role": "user", "content": [{"type": "text", "text": "see"}, REMOTE_IMAGE]}, assistant("ok")]
        second = [*first, {"role": "developer", "content": "be brief"}, user("and now?")]
        count = in_turn(registry, tokenizers, model, first, second)
        assert count == fresh(registry, tokenizers, model, second)
        assert count.components["images"] > 0 and any(n.startswith("messages[1]: content[1]") for n in count.notes)
        assert count.pinned_tokens == count.messages[0].tokens + count.messages[3].tokens

    def test_each_request_keeps_its_openings_for_the_next(self, model, registry, tokenizers):
        profile = registry.profile(model)
        cache = CountCache()
        messages = [SYSTEM, user("one"), assistant("two"), user("three")]
        RequestCounter(profile, tokenizers.get(profile.tokenizer), cache, hashes(messages)).request(
            {"messages": messages}
        )
        counted = cache.misses
        follow_up = [*messages, assistant("four"), user("five")]
        RequestCounter(profile, tokenizers.get(profile.tokenizer), cache, hashes(follow_up)).request(
            {"messages": follow_up}
        )
        openings = [size for size in sizes_to_keep(len(follow_up)) if size > len(messages)]  # past the carried one
        assert cache.misses - counted == 2 + len(openings)  # the two new messages counted, and those openings kept

    def test_a_request_sent_again_counts_its_results_again_as_it_did_the_first_time(self, model, registry, tokenizers):
        """A retry carries its whole count; what the trim then counts again (a result shrunk, on
        the same counter) must still see which parallel call each result answers."""
        profile = registry.profile(model)
        cache = CountCache()
        messages = [SYSTEM, user("find a and b"), calls("c1", "c2"), result("c1"), result("c2"), assistant("done")]
        first, again = (
            RequestCounter(profile, tokenizers.get(profile.tokenizer), cache, hashes(messages)) for _ in range(2)
        )
        assert first.request({"messages": messages}) == again.request({"messages": messages})
        for index in (3, 4):
            assert again.message(messages[index], index) == first.message(messages[index], index)


class TestWhatIsCountedAgain:
    def test_a_request_that_replaces_its_last_turn_encodes_only_that_turn(self, registry):
        profile, tokenizer, cache = registry.profile("gpt-4o"), CountingTokenizer(), CountCache()
        first = [SYSTEM, user("one " * 100), assistant("two " * 100), user("three " * 100)]
        second = [*first, assistant("four " * 100), user("five " * 100)]
        for messages in (first, second):
            RequestCounter(profile, tokenizer, cache, hashes(messages)).request({"messages": messages})
        encoded = tokenizer.encoded_chars
        edited = [*second[:-1], user("six " * 100)]  # the last question asked again, differently
        count = RequestCounter(profile, tokenizer, cache, hashes(edited)).request({"messages": edited})
        assert tokenizer.encoded_chars - encoded == len("six " * 100)
        assert count == RequestCounter(profile, tokenizer).request({"messages": edited})

    def test_siblings_of_a_conversation_whose_opening_was_let_go_walk_only_their_own_turns(self, registry):
        """Many clients asking their own follow-up of one conversation, after the cache let its
        opening go: the first keeps the opening where they part, and the others carry it."""
        profile = registry.profile("gpt-4o")
        conversation = [SYSTEM, *(user(f"question {i}") if i % 2 else assistant(f"answer {i}") for i in range(40))]
        first, cache = RequestCounter(profile, CountingTokenizer(), CountCache(), hashes(conversation)), CountCache()
        first.request({"messages": conversation})  # in another cache: this one lost it
        for client in range(3):
            sibling = [*conversation, assistant(f"nothing new, {client}"), user(f"and for {client}?")]
            looked_up = cache.hits + cache.misses
            counter = RequestCounter(profile, CountingTokenizer(), cache, hashes(sibling), len(conversation))
            count = counter.request({"messages": sibling})
            assert count == RequestCounter(profile, CountingTokenizer()).request({"messages": sibling})
            if client:  # the openings looked up and the two new messages: not each of the 43 (44 looks)
                assert cache.hits + cache.misses - looked_up <= LOOKED_UP + 2


class TestWorkFollowsWhatIsNew:
    def test_a_turn_without_tool_traffic_reads_none_of_the_conversation_s_calls(self, registry, monkeypatch):
        """An agent's conversation holds hundreds of calls and results; a turn that neither makes
        nor answers a call is counted without walking them again or re-marking their groups."""
        import proxy.core.counting.request_count as request_count

        walked: list[tuple[int, int]] = []
        marked: list[int] = []
        scan, flag = request_count.scan_calls, request_count.flag_groups
        monkeypatch.setattr(
            request_count, "scan_calls", lambda m, a, b, *rest: walked.append((a, b)) or scan(m, a, b, *rest)
        )
        monkeypatch.setattr(
            request_count, "flag_groups", lambda contexts: marked.append(len(contexts)) or flag(contexts)
        )
        profile, cache = registry.profile("gpt-4o"), CountCache()
        conversation = [SYSTEM]
        for i in range(100):
            conversation += [calls(f"a{i}", f"b{i}"), result(f"a{i}"), result(f"b{i}")]
        turns = [conversation, [*conversation, assistant("done"), user("and now?")]]
        turns.append([*turns[1], assistant("this"), user("thanks")])
        counts = []
        for earlier, messages in zip([[], *turns], turns, strict=False):
            walked.clear(), marked.clear()
            counter = RequestCounter(profile, CountingTokenizer(), cache, hashes(messages), shared(earlier, messages))
            counts.append(counter.request({"messages": messages}))
        assert walked == [] and marked == []  # the last turn: no table read
        assert counts == [RequestCounter(profile, CountingTokenizer()).request({"messages": m}) for m in turns]

    def test_a_conversation_without_tool_traffic_never_reads_the_calls(self, registry, monkeypatch):
        """Most conversations make no tool call: counted from nothing, in a new turn, after an
        edited question, sent again or without the reader's hashes, none of them walks the
        messages for calls or marks groups, and each count is the count made from nothing."""
        import proxy.core.counting.request_count as request_count

        read: list[str] = []
        for name in ("scan_calls", "flag_groups", "result_contexts"):
            monkeypatch.setattr(request_count, name, lambda *args, name=name: read.append(name))
        profile, cache = registry.profile("gpt-4o"), CountCache()
        first = [SYSTEM, user("one"), assistant("two"), user("three")]
        later = [*first, assistant("four"), user("five")]
        edited = [*later[:-1], user("six")]
        for earlier, messages in zip([[], first, later, edited], [first, later, edited, edited], strict=True):
            counter = RequestCounter(profile, CountingTokenizer(), cache, hashes(messages), shared(earlier, messages))
            expected = RequestCounter(profile, CountingTokenizer(), CountCache()).request({"messages": messages})
            assert counter.request({"messages": messages}) == expected
        assert read == []

    def test_the_marks_kept_with_an_opening_cost_the_cache_only_where_a_call_was_parallel(self, registry):
        """Where the request ended, its opening keeps the marks its counts were made with; with
        no parallel call those are its contexts as they are, held and weighed once."""
        profile = registry.profile("gpt-4o")

        def kept(messages):
            cache = CountCache()
            RequestCounter(profile, CountingTokenizer(), cache, hashes(messages)).request({"messages": messages})
            (opening,) = (v for v in cache._entries.values() if isinstance(v, Opening))
            return opening

        single = kept([SYSTEM, user("a"), calls("c1"), result("c1"), assistant("b")])
        assert single.flagged is single.contexts
        parallel = kept([SYSTEM, user("a"), calls("c1", "c2"), result("c1"), result("c2"), assistant("b")])
        assert parallel.flagged is not None and parallel.flagged[3].first and parallel.flagged[4].last
        assert not parallel.contexts[3].first  # the walk's own table stays unmarked
        tables = len(parallel.calls) + len(parallel.contexts) + len(parallel.marked) + len(parallel.flagged)
        assert parallel.footprint == 200 + 8 * 6 + 60 * tables + parallel.tally.footprint
        assert single.footprint == 200 + 8 * 5 + 60 * (1 + 1 + 0) + single.tally.footprint

    def test_a_turn_that_answers_a_call_still_reads_where_its_group_stands(self, registry, tokenizers):
        """A result that joins a parallel call of the opening moves its group's marks: counted as
        if from nothing, as before."""
        conversation = [SYSTEM, user("look up two things"), calls("c1", "c2"), result("c1")]
        later = [*conversation, result("c2"), assistant("both found")]
        retried = [*later, user("again?")]
        model = "gpt-4-0613"  # the measured parallel-call framing: the marks change the count
        assert in_turn(registry, tokenizers, model, conversation, later) == fresh(registry, tokenizers, model, later)
        assert in_turn(registry, tokenizers, model, conversation, later, retried, retried) == fresh(
            registry, tokenizers, model, retried
        )


class TestOpeningsLookedUp:
    def test_longest_first(self):
        assert sizes_to_look_up(40) == (40, 39, 38, 37, 36)
        assert sizes_to_look_up(3) == (3, 2, 1)

    def test_a_new_turn_looks_first_where_the_request_before_it_kept_its_own(self):
        """The prefix reader says how many messages the request shares with the earlier body: the
        opening that body's request kept, found with the first look instead of the third."""
        assert sizes_to_look_up(42, shared=40) == (40, 42, 41, 39, 38)
        assert sizes_to_look_up(42, shared=42) == (42, 41, 40, 39, 38)  # sent again
        assert sizes_to_look_up(42, shared=10) == (42, 41, 40, 39, 38)  # no opening of the request's to find there


class TestOpeningsKept:
    def test_a_request_keeps_its_own_opening(self):
        assert sizes_to_keep(40) == (40,)

    def test_one_whose_opening_was_let_go_keeps_one_where_a_sibling_of_its_length_looks(self):
        assert sizes_to_keep(40, shared=38) == (40, 38)
        assert sizes_to_keep(40, shared=38, carried=38) == (40,)  # carried: kept already
        assert sizes_to_keep(40, shared=38, carried=30) == (40, 38)

    def test_not_where_it_shares_only_an_opening_no_sibling_would_look_up(self):
        """Another conversation under the same system prompt: its first message is all it shares."""
        assert sizes_to_keep(40, shared=1) == (40,)
        assert sizes_to_keep(40, shared=40 - LOOKED_UP) == (40,)


TURN = st.one_of(
    st.builds(user, st.text(max_size=30)),
    st.builds(assistant, st.text(max_size=30)),
    st.lists(st.sampled_from(["c1", "c2", "c3", "c4"]), min_size=1, max_size=3, unique=True).map(
        lambda ids: calls(*ids)
    ),
    st.builds(result, st.sampled_from(["c1", "c2", "c3", "c4", "c9"]), st.text(max_size=20)),
    # A pinned message in the middle, and parts that carry notes and image tokens.
    st.builds(lambda text: {"role": "developer", "content": text}, st.text(max_size=20)),
    st.builds(
        lambda text: {"role": "user", "content": [{"type": "text", "text": text}, REMOTE_IMAGE]},
        st.text(max_size=20),
    ),
)


class TestAnyConversation:
    @settings(max_examples=120, deadline=None)
    @given(
        model=st.sampled_from(MODELS),
        first=st.lists(TURN, min_size=1, max_size=10),
        kept=st.integers(0, 10),
        added=st.lists(TURN, max_size=5),
        third=st.lists(TURN, max_size=3),
    )
    def test_any_sequence_of_follow_ups_counts_as_each_counted_anew(
        self, registry, tokenizers, model, first, kept, added, third
    ):
        second = [SYSTEM, *first[:kept], *added]
        requests = [[SYSTEM, *first], second, [*second, *third]]
        for n in range(1, len(requests) + 1):
            assert in_turn(registry, tokenizers, model, *requests[:n]) == fresh(
                registry, tokenizers, model, requests[n - 1]
            )
