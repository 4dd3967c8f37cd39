"""The event that ends a broken stream, in each API's grammar."""

from __future__ import annotations

import json

from proxy.apis.stream_errors import broken_stream_event


def _parse(event: bytes) -> tuple[str | None, dict]:
    name, data = None, None
    for line in event.decode().strip().splitlines():
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            data = json.loads(line[6:])
    assert data is not None
    return name, data


class TestBrokenStreamEvent:
    def test_anthropic_gets_a_named_error_event_in_its_error_shape(self):
        name, data = _parse(broken_stream_event("messages", "it broke"))
        assert name == "error" and data == {"type": "error", "error": {"type": "api_error", "message": "it broke"}}

    def test_responses_gets_an_error_event_with_its_fields_and_an_error_object(self):
        name, data = _parse(broken_stream_event("responses", "it broke"))
        assert name == "error" and data["type"] == "error" and data["code"] == "upstream_stream_broken"
        assert data["message"] == "it broke" and data["error"]["code"] == "upstream_stream_broken"

    def test_chat_and_completions_keep_an_unnamed_event_with_an_error_object(self):
        for api in ("chat", "completions", "passthrough"):
            name, data = _parse(broken_stream_event(api, "it broke"))
            assert name is None and data["error"]["code"] == "upstream_stream_broken"
