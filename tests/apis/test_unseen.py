"""Parts the guard cannot see are found wherever a body may hold one, and looked for nowhere else."""

from __future__ import annotations

import json

import pytest

from proxy.apis.registry import AdapterRegistry
from proxy.apis.unseen import may_hold_unseen, unseen_parts

FILE_BY_ID = {"type": "file", "file": {"file_id": "file-abc"}}
AUDIO_WITHOUT_DATA = {"type": "input_audio", "input_audio": {"format": "wav"}}


def chat(*parts: object) -> dict[str, object]:
    return {"model": "gpt-4o", "messages": [{"role": "user", "content": ["hi", *parts][1:] or "hi"}]}


class TestMayHoldUnseen:
    def test_a_body_without_the_type_values_holds_none(self):
        raw = json.dumps(chat({"type": "text", "text": "a profile of a file-like thing"})).encode()
        assert not may_hold_unseen(raw)

    @pytest.mark.parametrize("part", [FILE_BY_ID, AUDIO_WITHOUT_DATA])
    def test_a_body_naming_an_unseen_type_may_hold_one(self, part):
        assert may_hold_unseen(json.dumps(chat(part)).encode())

    def test_a_type_spelled_with_escapes_is_looked_for_too(self):
        """`"\\u0066ile"` is `"file"` once read: any escape in the body means a walk."""
        raw = json.dumps(chat(FILE_BY_ID)).replace('"file"', '"\\u0066ile"', 1).encode()
        assert json.loads(raw)["messages"][0]["content"][0]["type"] == "file"
        assert may_hold_unseen(raw)


class TestEndpointParse:
    @pytest.mark.parametrize("escaped", [False, True])
    def test_a_file_by_id_marks_the_request_not_read_whole(self, escaped):
        text = json.dumps(chat(FILE_BY_ID))
        raw = (text.replace('"file"', '"\\u0066ile"', 1) if escaped else text).encode()
        endpoint = AdapterRegistry().endpoint_for("/v1/chat/completions")
        parsed = endpoint.parse(json.loads(raw), raw=raw)
        assert parsed.unseen == ("messages[0].content[0]: file by id or URL",)
        assert not parsed.read_whole

    def test_the_walk_finds_what_the_bytes_said_may_be_there(self):
        assert unseen_parts(chat(AUDIO_WITHOUT_DATA)["messages"]) == ("messages[0].content[0]: audio without its data",)
