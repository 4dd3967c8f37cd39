"""The prefix reader: a body that re-sends an earlier, accepted body's messages is read as the
full strict reader reads it, parsing only the new bytes, and refused exactly as it would be."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.apis.anthropic.messages import MessagesAdapter
from proxy.apis.fitting import Counting, fit
from proxy.apis.openai.chat import ChatAdapter
from proxy.apis.openai.responses import ResponsesAdapter
from proxy.core.counting.count_cache import CountCache
from proxy.core.plan import TrimPolicy
from proxy.core.trimming.strategies import STRATEGIES, build_pipeline
from proxy.wire.codec import JsonLimits, UnreadableJson, read_json
from proxy.wire.prefix_reader import PrefixReader


def conversation(turns: int, words: int = 40, tag: str = "") -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse. " * 10}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"{tag}question {i}: " + "why is the sky blue " * words})
        messages.append({"role": "assistant", "content": f"{tag}answer {i}: " + "light scatters " * words})
    return messages


def body(messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"model": "gpt-4o", "messages": messages, **fields}


COMPACT = orjson.dumps


def spaced(value: Any) -> bytes:
    return json.dumps(value).encode()  # ", " and ": ", non-ASCII escaped: what aiohttp's json= writes


def indented(value: Any) -> bytes:
    return json.dumps(value, indent=2, ensure_ascii=False).encode()


def reader(**options: Any) -> PrefixReader:
    return PrefixReader("messages", **{"min_body": 256, **options})


def accepted(prefix: PrefixReader, raw: bytes) -> Any:
    reading = prefix.read(raw)
    prefix.keep(reading)
    return reading


class TestReadingAConversationReSent:
    @pytest.mark.parametrize("write", [COMPACT, spaced, indented], ids=["compact", "spaced", "indented"])
    def test_a_body_that_appends_turns_reads_as_the_full_reader_reads_it(self, write):
        prefix = reader()
        first = conversation(6)
        accepted(prefix, write(body(first, stream=True)))
        raw = write(body([*first, {"role": "user", "content": "and at night?"}], stream=True))
        reading = prefix.read(raw)
        assert reading.value == read_json(raw)
        assert list(reading.value) == list(read_json(raw))  # the keys in the order they came

    def test_the_messages_it_shares_are_the_very_objects_read_before(self):
        prefix = reader()
        first = accepted(prefix, COMPACT(body(conversation(4))))
        reading = prefix.read(COMPACT(body([*conversation(4), {"role": "user", "content": "more"}])))
        shared = first.value["messages"]
        assert all(a is b for a, b in zip(reading.value["messages"], shared, strict=False))
        assert reading.known.checked == len(shared)

    def test_each_message_gets_the_same_hash_whichever_way_it_was_read(self):
        prefix, fresh = reader(), reader()
        accepted(prefix, spaced(body(conversation(4))))
        raw = spaced(body([*conversation(4), {"role": "user", "content": "more"}]))
        assert prefix.read(raw).known.hashes == fresh.read(raw).known.hashes

    def test_a_compactly_written_message_is_keyed_as_the_count_cache_keys_it_unread(self):
        messages = conversation(3)
        reading = reader().read(COMPACT(body(messages)))
        assert reading.known.hashes == tuple(hash(orjson.dumps(m)) for m in messages)

    def test_a_body_that_changes_an_earlier_message_reuses_only_what_comes_before_it(self):
        prefix = reader()
        messages = conversation(6)
        accepted(prefix, COMPACT(body(messages)))
        edited = [*messages[:5], {"role": "user", "content": "a different question"}, *messages[6:]]
        reading = prefix.read(COMPACT(body(edited)))
        assert reading.known.checked == 5
        assert reading.value == body(edited)

    def test_an_integer_beyond_64_bits_in_what_is_new_is_read_exactly(self):
        prefix = reader()
        accepted(prefix, spaced(body(conversation(3))))
        raw = spaced(body([*conversation(3), {"role": "user", "content": "x", "seed": 2**70}], n=2**65))
        reading = prefix.read(raw)
        assert reading.value["messages"][-1]["seed"] == 2**70 and reading.value["n"] == 2**65
        assert reading.known.checked == 7

    def test_a_body_read_but_not_accepted_is_not_built_on(self):
        prefix = reader()
        prefix.read(COMPACT(body(conversation(4))))
        assert prefix.read(COMPACT(body(conversation(5)))).known.checked == 0

    def test_of_several_conversations_with_one_system_prompt_each_builds_on_its_own(self):
        prefix = reader()
        for tag in "abcdefgh":
            accepted(prefix, COMPACT(body(conversation(3, tag=tag))))
        follow_up = [*conversation(3, tag="c"), {"role": "user", "content": "and?"}]
        reading = prefix.read(COMPACT(body(follow_up)))
        assert reading.known.checked == 7
        assert reading.value == body(follow_up)

    def test_a_body_that_ends_as_the_earlier_one_reuses_its_fields_after_the_messages(self):
        prefix = reader()
        tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
        first = accepted(prefix, COMPACT(body(conversation(4), tools=tools, stream=True)))
        raw = COMPACT(body([*conversation(4), {"role": "user", "content": "more"}], tools=tools, stream=True))
        reading = prefix.read(raw)
        assert reading.value == read_json(raw) and list(reading.value) == list(read_json(raw))
        assert reading.known.others_known and reading.value["tools"] is first.value["tools"]

    @pytest.mark.parametrize("write", [COMPACT, indented], ids=["compact", "indented"])
    def test_a_body_sent_again_as_it_was_is_the_earlier_reading_again(self, write):
        """A retry: every message and every field after them is the value read before."""
        prefix = reader()
        tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
        raw = write(body(conversation(4), tools=tools))
        first = accepted(prefix, raw)
        again = prefix.read(bytes(raw))
        assert again.value == read_json(raw) and list(again.value) == list(read_json(raw))
        assert again.known.checked == 9 and again.known.others_known
        assert again.value["tools"] is first.value["tools"] and again.known.hashes == first.known.hashes

    def test_a_body_sent_again_is_found_by_its_bytes_and_reuses_the_body_kept_with_nothing_parsed(self, monkeypatch):
        prefix = reader()
        raw = COMPACT(body(conversation(4)))
        first = accepted(prefix, raw)
        parsed: list[bytes] = []
        monkeypatch.setattr("proxy.wire.prefix_reader.read_json", lambda raw, limits: parsed.append(raw))
        match = prefix.match(bytes(raw))
        again = prefix.read(bytes(raw), match)
        assert match.same and match.new_bytes == 0 and again.body is first.body and parsed == []
        assert again.value is not first.value and again.value["messages"] is not first.value["messages"]

    def test_a_body_sent_again_is_found_whether_it_was_kept_last_or_before_a_sibling(self):
        """The most recent body of a family is compared first; an older one is still found."""
        prefix = reader()
        opening = conversation(4)
        raws = [COMPACT(body([*opening, {"role": "user", "content": f"and {tail}?"}])) for tail in "ab"]
        kept = [accepted(prefix, raw) for raw in raws]  # siblings: the same opening, another last turn
        for raw, earlier in [(raws[1], kept[1]), (raws[0], kept[0]), (raws[0], kept[0])]:
            match = prefix.match(bytes(raw))
            assert match.same and match.earlier is earlier.body
            prefix.keep(prefix.read(bytes(raw), match))

    def test_a_turn_after_the_most_recent_body_s_opening_is_read_from_it_with_no_other_looked_for(
        self, monkeypatch
    ):
        """Clients asking their own follow-up of one conversation: each body shares all but its
        last turn with the body kept just before it, which is the one built on."""
        prefix = reader()
        opening = conversation(4)
        raws = [COMPACT(body([*opening, {"role": "user", "content": f"and {tail}?"}])) for tail in "abc"]
        kept = [accepted(prefix, raw) for raw in raws[:2]]
        monkeypatch.setattr(prefix, "_candidates", lambda raw: pytest.fail("looked for other bodies"))
        match = prefix.match(raws[2])
        assert match.earlier is kept[1].body and match.shared == len(opening) and not match.same
        assert prefix.read(raws[2], match).value == read_json(raws[2])

    def test_a_body_sent_again_and_kept_is_kept_once_as_the_most_recent(self):
        prefix = reader()
        raws = [COMPACT(body(conversation(3, tag=tag))) for tag in "ab"]
        kept = [accepted(prefix, raw) for raw in raws]
        accepted(prefix, bytes(raws[0]))
        assert len(prefix._bodies) == 2 and prefix._bytes == sum(map(len, raws))
        assert next(reversed(prefix._bodies.values())) is kept[0].body

    def test_a_body_cut_back_to_fewer_messages_with_the_same_ending_reads_as_the_full_reader_reads_it(self):
        prefix = reader()
        accepted(prefix, COMPACT(body(conversation(4), n=1)))
        raw = COMPACT(body(conversation(2), n=1))
        reading = prefix.read(raw)
        assert reading.value == read_json(raw) and reading.known.checked == 5 and reading.known.others_known

    @pytest.mark.parametrize("space", [b"\x0b", b"\x0c"], ids=["vertical tab", "form feed"])
    def test_a_space_json_does_not_allow_before_the_end_of_the_messages_is_refused_as_ever(self, space):
        prefix = reader()
        raw = COMPACT(body(conversation(4), n=1))
        accepted(prefix, raw)
        close = raw.rindex(b"]")
        with pytest.raises(UnreadableJson):
            prefix.read(raw[:close] + space + raw[close:])

    def test_an_ending_that_matches_after_another_array_is_read_as_the_full_reader_reads_it(self):
        prefix = reader()
        accepted(prefix, COMPACT(body(conversation(4), n=1)))
        # Ends with `],"n":1}` too, but that `]` closes `stop`, not the messages.
        raw = COMPACT(body([*conversation(4), {"role": "user", "content": "more"}], stop=["x"], n=1))
        reading = prefix.read(raw)
        assert reading.value == read_json(raw) and list(reading.value) == list(read_json(raw))
        assert reading.known.checked == 9 and not reading.known.others_known

    def test_small_bodies_are_read_in_full_and_not_kept(self):
        prefix = PrefixReader("messages", min_body=10_000)
        accepted(prefix, COMPACT(body(conversation(1, words=2))))
        assert prefix.read(COMPACT(body(conversation(2, words=2)))).known.checked == 0

    def test_an_array_of_other_things_than_objects_is_read_in_full(self):
        prefix = reader()
        raw = COMPACT({"model": "m", "messages": ["a" * 300, "b"]})
        assert accepted(prefix, raw).body is None
        assert prefix.read(COMPACT({"model": "m", "messages": ["a" * 300, "b", "c"]})).value["messages"][2] == "c"


class TestRefusals:
    """What follows the shared messages is held to the same rules, with the same words."""

    @pytest.fixture
    def prefix(self) -> PrefixReader:
        prefix = reader(limits=JsonLimits(max_depth=8))
        accepted(prefix, COMPACT(body(conversation(4), stream=False)))
        return prefix

    def shared_then(self, tail: bytes) -> bytes:
        raw = COMPACT(body(conversation(4), stream=False))
        cut = raw.rindex(b"]")
        return raw[:cut] + tail

    @pytest.mark.parametrize(
        "tail",
        [
            b',{"role":"user","content":"a","content":"b"}],"stream":false}',  # a key twice in a new message
            b'],"stream":false,"stream":true}',  # a key twice after the array
            b'],"stream":false,"model":"other"}',  # a key that came before the array, again
            b'],"stream":false,"messages":[]}',  # the array's own key, again
            b',{"role":"user","content":[[[[[[[["deep"]]]]]]]]}],"stream":false}',  # deeper than allowed
            b',{"role":"user","content":"\\ud800"}],"stream":false}',  # a lone surrogate
            b',{"role":"user","content":"a"],"stream":false}',  # not JSON
            b',{"role":"user","content":"a"}]',  # the object never closes
            b',{"role":"user","content":"a"}],"stream":false}   x',  # something after the object
        ],
    )
    def test_a_bad_rest_is_refused_with_the_full_reader_s_words(self, prefix, tail):
        raw = self.shared_then(tail)
        with pytest.raises(UnreadableJson) as full:
            read_json(raw, JsonLimits(max_depth=8))
        with pytest.raises(UnreadableJson) as read:
            prefix.read(raw)
        assert (str(read.value), read.value.param) == (str(full.value), full.value.param)


class TestMemory:
    def test_the_bodies_kept_stay_within_their_byte_bound(self):
        prefix = reader(max_bytes=64 * 1024)
        for tag in range(40):
            accepted(prefix, COMPACT(body(conversation(3, tag=str(tag)))))
        assert prefix._bytes <= 64 * 1024
        assert len(prefix._bodies) < 40

    def test_a_body_that_extends_another_replaces_it(self):
        prefix = reader()
        messages = conversation(2)
        for turn in range(10):
            messages = [*messages, {"role": "user", "content": f"turn {turn} " * 30}]
            accepted(prefix, COMPACT(body(messages)))
        assert len(prefix._bodies) == 1

    def test_no_memory_means_every_body_is_read_in_full(self):
        prefix = reader(max_bytes=0)
        accepted(prefix, COMPACT(body(conversation(3))))
        assert prefix.read(COMPACT(body(conversation(4)))).known.checked == 0


def chat_body(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return body(messages, max_tokens=500)


def anthropic_body(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "claude-3-5-sonnet-20241022", "max_tokens": 500, "system": "Be terse.", "messages": messages[1:]}


def responses_body(messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "gpt-4o", "max_output_tokens": 500, "input": messages}


SHAPES = {
    "chat": (ChatAdapter, "messages", chat_body),
    "messages": (MessagesAdapter, "messages", anthropic_body),
    "responses": (ResponsesAdapter, "input", responses_body),
}


class TestTheCoreLeavesSharedMessagesAlone:
    @pytest.mark.parametrize("shape", sorted(SHAPES))
    @pytest.mark.parametrize("strategy", sorted(STRATEGIES))
    def test_trimming_a_re_sent_conversation_does_not_change_what_the_next_request_shares(
        self, shape, strategy, registry, tokenizers
    ):
        """Each strategy runs, through each adapter, on a body whose messages the reader keeps
        for later requests."""
        adapter_type, key, write = SHAPES[shape]
        prefix = PrefixReader(key, min_body=256)
        messages = conversation(30, words=60)
        accepted(prefix, COMPACT(write(messages)))
        longer = COMPACT(write([*messages, {"role": "user", "content": "summarise " * 400}]))
        reading = prefix.read(longer)
        assert reading.known.checked > 0
        adapter = adapter_type()
        parsed = adapter.parse(reading.value, reading.known)
        profile = registry.profile(parsed.model)
        policy = TrimPolicy(pipeline=build_pipeline([strategy]), overflow="forward")
        counting = Counting(profile, tokenizers.get(profile.tokenizer), CountCache(), 3_000)
        fitted = fit(adapter, parsed, counting, policy)
        assert fitted.plan.result.outcome != "fits"
        prefix.keep(reading)
        kept = prefix._bodies[next(reversed(prefix._bodies))]
        assert kept.elements == orjson.loads(longer)[key]
        assert reading.value == orjson.loads(longer)


MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "tool", "system"])},
    optional={
        "content": st.one_of(st.text(max_size=40), st.none()),
        "name": st.text(max_size=8),
        "x": st.recursive(
            st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=5),
            lambda c: st.lists(c, max_size=3),
        ),
    },
)


INT64 = st.integers(-(2**63), 2**63 - 1)  # what orjson, one of the writers, can write
AFTER = st.dictionaries(st.sampled_from(["stream", "tools", "n"]), INT64, max_size=2)


class TestProperties:
    @settings(max_examples=150, deadline=None)
    @given(
        first=st.lists(MESSAGE, min_size=1, max_size=8),
        keep=st.integers(0, 8),
        added=st.lists(MESSAGE, max_size=4),
        write=st.sampled_from([COMPACT, spaced, indented]),
        after=AFTER,
        changed=st.one_of(st.none(), AFTER, st.lists(INT64, max_size=2).map(lambda stop: {"stop": stop})),
    )
    def test_any_follow_up_reads_as_the_full_reader_reads_it(self, first, keep, added, write, after, changed):
        """Fields after the messages the same as before (the usual re-send), or not."""
        prefix = PrefixReader("messages", min_body=0)
        accepted(prefix, write({"model": "m", "messages": first, **after}))
        later = after if changed is None else {**changed, **after}
        raw = write({"model": "m", "messages": [*first[:keep], *added], **later})
        if not [*first[:keep], *added]:
            return
        reading = prefix.read(raw)
        assert reading.value == read_json(raw) and list(reading.value) == list(read_json(raw))
        assert reading.known.hashes in ((), PrefixReader("messages", min_body=0).read(raw).known.hashes)
