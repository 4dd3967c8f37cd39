"""Parts the guard cannot see are found in whatever message and part holds one, and nowhere else;
in a conversation sent again, in every body that holds one."""

from __future__ import annotations

import json

import orjson
import pytest

from proxy.apis.base import Parsed
from proxy.apis.fields import NAMED_AT_MOST, KnownPrefix, unseen_parts
from proxy.apis.registry import AdapterRegistry
from proxy.wire.readers import BodyReaders

FILE_BY_ID = {"type": "file", "file": {"file_id": "file-abc"}}
FILE_WITH_DATA = {"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0="}}
AUDIO_WITHOUT_DATA = {"type": "input_audio", "input_audio": {"format": "wav"}}
TEXT = {"type": "text", "text": "a profile of a file-like thing"}


def chat(*parts: object) -> dict[str, object]:
    return {"model": "gpt-4o", "messages": [{"role": "user", "content": ["hi", *parts][1:] or "hi"}]}


class TestUnseenParts:
    def test_texts_images_and_files_carrying_their_data_are_seen(self):
        image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
        assert unseen_parts(chat(TEXT, image, FILE_WITH_DATA)["messages"]) == ()

    def test_string_contents_hold_no_parts(self):
        assert unseen_parts([{"role": "user", "content": "file"}, {"role": "assistant", "content": None}]) == ()

    def test_audio_without_its_data_is_named_where_it_stands(self):
        messages = [{"role": "system", "content": "s"}, *chat(TEXT, AUDIO_WITHOUT_DATA)["messages"]]
        assert unseen_parts(messages) == ("messages[1].content[1]: audio without its data",)

    def test_an_anthropic_document_by_reference_is_unseen(self):
        document = {"type": "item", "item": {"type": "document", "source": {"type": "file", "file_id": "f"}}}
        assert unseen_parts(chat(document)["messages"]) == ("messages[0].content[0]: document by file id or URL",)

    def test_at_most_a_few_are_named(self):
        assert len(unseen_parts(chat(*[FILE_BY_ID] * (NAMED_AT_MOST + 5))["messages"])) == NAMED_AT_MOST

    def test_messages_before_start_are_known_to_hold_none(self):
        messages = [*chat(FILE_BY_ID)["messages"], *chat(AUDIO_WITHOUT_DATA)["messages"]]
        assert unseen_parts(messages, start=1) == ("messages[1].content[0]: audio without its data",)


class TestEndpointParse:
    @pytest.mark.parametrize("escaped", [False, True])
    def test_a_file_by_id_marks_the_request_not_read_whole(self, escaped):
        """However the body spells the type (`"\\u0066ile"` is `"file"` once read)."""
        text = json.dumps(chat(FILE_BY_ID))
        raw = (text.replace('"file"', '"\\u0066ile"', 1) if escaped else text).encode()
        endpoint = AdapterRegistry().endpoint_for("/v1/chat/completions")
        parsed = endpoint.parse(json.loads(raw))
        assert parsed.unseen == ("messages[0].content[0]: file by id or URL",)
        assert not parsed.read_whole

    def test_a_body_of_seen_parts_is_read_whole(self):
        endpoint = AdapterRegistry().endpoint_for("/v1/chat/completions")
        parsed = endpoint.parse(chat(TEXT, FILE_WITH_DATA))
        assert parsed.unseen == ()
        assert parsed.read_whole


def _conversation(turns: int, first: object = "tell me") -> list[dict[str, object]]:
    """A conversation of well over the prefix reader's smallest body kept."""
    messages: list[dict[str, object]] = [{"role": "user", "content": first}]
    for i in range(turns):
        messages += [
            {"role": "assistant", "content": f"answer {i} " + "word " * 60},
            {"role": "user", "content": f"question {i} " + "word " * 60},
        ]
    return messages


class TestAConversationSentAgain:
    """A body that re-sends an earlier one's messages looks for unseen parts only in those the
    earlier body's view did not hold with every part seen."""

    @staticmethod
    def parse(readers: BodyReaders, messages: list[dict[str, object]]) -> tuple[Parsed, KnownPrefix]:
        """As a request's body is parsed (proxy.wire.readers.parsed_request): read, parse, then accepted."""
        endpoint = AdapterRegistry().endpoint_for("/v1/chat/completions")
        reading = readers.read(endpoint.adapter, orjson.dumps({"model": "gpt-4o", "messages": messages}))
        parsed = endpoint.parse(reading.value, reading.known)
        readers.accepted(endpoint.adapter, reading, seen_whole=not parsed.unseen)
        return parsed, reading.known

    def readers(self) -> BodyReaders:
        return BodyReaders(AdapterRegistry().adapters, prefix_memory_bytes=1 << 20)

    def test_the_messages_of_a_body_seen_whole_are_not_looked_through_again(self):
        readers, messages = self.readers(), _conversation(10)
        self.parse(readers, messages)
        follow_up = [*messages, {"role": "user", "content": [FILE_BY_ID]}]
        parsed, known = self.parse(readers, follow_up)
        assert known.checked == known.seen_whole == len(messages)
        assert parsed.unseen == (f"messages[{len(messages)}].content[0]: file by id or URL",)

    def test_an_unseen_part_of_an_earlier_body_is_named_again_in_every_body_that_re_sends_it(self):
        readers, messages = self.readers(), _conversation(10, first=[TEXT, FILE_BY_ID])
        for turns in range(3):
            parsed, known = self.parse(readers, [*messages, *_conversation(turns)[1:]])
            assert known.seen_whole == 0
            assert parsed.unseen == ("messages[0].content[1]: file by id or URL",)
            assert not parsed.read_whole

    def test_a_body_sent_again_as_it_was_knows_whether_it_was_seen_whole(self):
        readers = self.readers()
        for first, seen in ((TEXT, True), (FILE_BY_ID, False)):
            messages = _conversation(10, first=[first])
            self.parse(readers, messages)
            parsed, known = self.parse(readers, messages)
            assert known.same is not None and known.seen_whole == (len(messages) if seen else 0)
            assert parsed.read_whole is seen
