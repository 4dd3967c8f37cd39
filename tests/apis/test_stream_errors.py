"""The event that ends a broken stream, in each API's grammar (each adapter's `broken_stream_event`)."""

from __future__ import annotations

import json

from proxy.apis.registry import AdapterRegistry
from proxy.apis.stream_errors import openai_broken

REGISTRY = AdapterRegistry()


def broken_stream_event(api: str, message: str) -> bytes:
    """The event the adapter of `api` ends a broken stream with."""
    return REGISTRY.by_name(api).broken_stream_event(message)


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
        for event in (broken_stream_event("chat", "it broke"), broken_stream_event("completions", "it broke")):
            name, data = _parse(event)
            assert name is None and data["error"]["code"] == "upstream_stream_broken"

    def test_a_path_passed_through_gets_openai_s_event(self):
        name, data = _parse(openai_broken("it broke"))
        assert name is None and data["error"]["code"] == "upstream_stream_broken"
