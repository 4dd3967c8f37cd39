"""AWS event stream framing, checked against botocore's own parser (what boto3 decodes with)."""

from __future__ import annotations

import json
import zlib

import pytest

from proxy.apis.bedrock.aws_event_stream import EventStreamDecoder, EventStreamError, encode_message

botocore_eventstream = pytest.importorskip("botocore.eventstream")


def _event(kind: str, payload: dict[str, object]) -> bytes:
    headers = {":message-type": "event", ":event-type": kind, ":content-type": "application/json"}
    return encode_message(headers, json.dumps(payload).encode())


class TestEncodeMessage:
    def test_botocore_reads_what_it_writes(self) -> None:
        frame = _event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "Hi"}})
        buffer = botocore_eventstream.EventStreamBuffer()
        buffer.add_data(frame)
        (message,) = list(buffer)
        assert message.headers[":event-type"] == "contentBlockDelta"
        assert json.loads(message.payload) == {"contentBlockIndex": 0, "delta": {"text": "Hi"}}

    def test_bytes_bool_and_int_headers_keep_their_types(self) -> None:
        frame = encode_message({"b": b"\x00\x01", "t": True, "f": False, "n": -7}, b"")
        buffer = botocore_eventstream.EventStreamBuffer()
        buffer.add_data(frame)
        (message,) = list(buffer)
        assert message.headers == {"b": b"\x00\x01", "t": True, "f": False, "n": -7}


class TestEventStreamDecoder:
    def test_messages_fed_a_byte_at_a_time_come_out_whole_and_in_order(self) -> None:
        frames = _event("messageStart", {"role": "assistant"}) + _event("metadata", {"usage": {"inputTokens": 9}})
        decoder = EventStreamDecoder()
        messages = [m for i in range(len(frames)) for m in decoder.feed(frames[i : i + 1])]
        assert [m.event_type for m in messages] == ["messageStart", "metadata"]
        assert json.loads(messages[1].payload) == {"usage": {"inputTokens": 9}}
        assert decoder.pending == 0

    def test_an_exception_message_names_its_exception_type(self) -> None:
        headers = {":message-type": "exception", ":exception-type": "validationException"}
        (message,) = EventStreamDecoder().feed(encode_message(headers, b'{"message": "too long"}'))
        assert message.message_type == "exception" and message.event_type == "validationException"

    def test_a_corrupted_payload_is_refused_by_its_crc(self) -> None:
        frame = bytearray(_event("metadata", {"usage": {}}))
        frame[-6] ^= 0xFF
        with pytest.raises(EventStreamError, match="CRC"):
            list(EventStreamDecoder().feed(bytes(frame)))

    def test_a_prelude_claiming_a_huge_message_is_refused_before_it_is_buffered(self) -> None:
        prelude = (1 << 31).to_bytes(4, "big") + (0).to_bytes(4, "big")
        frame = prelude + zlib.crc32(prelude).to_bytes(4, "big")
        with pytest.raises(EventStreamError, match="out of bounds"):
            list(EventStreamDecoder().feed(frame))

    def test_botocore_and_the_decoder_agree_on_a_real_stream(self) -> None:
        frames = b"".join(
            _event(k, {"i": i}) for i, k in enumerate(["messageStart", "contentBlockDelta", "messageStop"])
        )
        buffer = botocore_eventstream.EventStreamBuffer()
        buffer.add_data(frames)
        theirs = [(m.headers[":event-type"], m.payload) for m in buffer]
        ours = [(m.event_type, m.payload) for m in EventStreamDecoder().feed(frames)]
        assert ours == theirs
