"""Bedrock's event streams as the relay's tap passes them: in whole frames, with the usage read from
them by the shape's framing and its own spelling of the usage."""

from __future__ import annotations

import base64
import json

from botocore.eventstream import EventStreamBuffer

from proxy.apis.bedrock.aws_event_stream import encode_message
from proxy.apis.bedrock.converse import ConverseAdapter
from proxy.apis.bedrock.event_streams import CONTENT_TYPE, broken_frame
from proxy.apis.bedrock.runtime import InvokeAdapter
from proxy.server.upstream.usage import FramedTap, Usage


def _frame(event: str, payload: dict[str, object]) -> bytes:
    headers = {":event-type": event, ":content-type": "application/json", ":message-type": "event"}
    return encode_message(headers, json.dumps(payload).encode())


def _chunk(event: dict[str, object]) -> bytes:
    return _frame("chunk", {"bytes": base64.b64encode(json.dumps(event).encode()).decode()})


def EventStreamTap(adapter: ConverseAdapter | InvokeAdapter | None = None) -> FramedTap:
    """The relay's tap for a Bedrock stream, as the request path builds it from the shape's hooks."""
    shape = adapter or ConverseAdapter()
    framing = shape.stream_framing(CONTENT_TYPE)
    assert framing is not None
    return FramedTap(framing, shape.answer_usage)


class TestEventStreamTap:
    def test_a_server_sent_events_answer_is_not_framed_as_an_event_stream(self) -> None:
        assert ConverseAdapter().stream_framing("text/event-stream") is None


    def test_only_whole_frames_pass_and_every_byte_passes_once(self) -> None:
        stream = _frame("messageStart", {"role": "assistant"}) + _frame("messageStop", {"stopReason": "end_turn"})
        tap = EventStreamTap()
        out = [tap.feed(stream[k : k + 7]) for k in range(0, len(stream), 7)]
        assert b"".join(out) + tap.finish() == stream
        assert all(piece in (b"", stream[: len(piece)], stream[len(stream) - len(piece) :]) for piece in out)

    def test_converses_metadata_gives_the_usage_with_the_caches_tokens(self) -> None:
        tap = EventStreamTap()
        usage = {"inputTokens": 100, "outputTokens": 7, "cacheReadInputTokens": 50, "cacheWriteInputTokens": 25}
        tap.feed(_frame("metadata", {"usage": usage, "metrics": {"latencyMs": 3}}))
        assert tap.reported.usage == Usage(175, 7, 50) and tap.ended

    def test_invoke_chunks_give_anthropics_usage(self) -> None:
        tap = EventStreamTap(InvokeAdapter())
        start = {"type": "message_start", "message": {"usage": {"input_tokens": 321, "output_tokens": 1}}}
        tap.feed(_chunk(start) + _chunk({"type": "message_delta", "usage": {"output_tokens": 9}}))
        tap.feed(_chunk({"type": "message_stop"}))
        assert tap.reported.usage is not None and tap.reported.usage.prompt_tokens == 321 and tap.ended

    def test_a_stream_that_does_not_check_is_passed_on_unread(self) -> None:
        tap = EventStreamTap()
        assert tap.feed(b"\x00\x00\x00\x10garbage!!") == b"\x00\x00\x00\x10garbage!!" and tap.feed(b"more") == b"more"


class TestBrokenFrame:
    def test_botocore_reads_the_exception_frame(self) -> None:
        buffer = EventStreamBuffer()
        buffer.add_data(broken_frame("upstream ended the stream early"))
        (message,) = list(buffer)
        assert message.headers[":message-type"] == "exception"
        assert json.loads(message.payload) == {"message": "upstream ended the stream early"}
