"""Parts the guard cannot see are found in whatever message and part holds one, and nowhere else."""

from __future__ import annotations

import json

import pytest

from proxy.apis.registry import AdapterRegistry
from proxy.apis.unseen import NAMED_AT_MOST, unseen_parts

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
