"""Bedrock's streamed answers (AWS event streams) as the relay sees them: whole frames passed on,
their payloads handed over for the usage they carry, and the frame that ends a broken stream.

ConverseStream ends with a `metadata` event whose `usage` is the provider's count
(`inputTokens`, `outputTokens`, `cacheReadInputTokens`, `cacheWriteInputTokens`: read by
`converse_usage`); InvokeModelWithResponseStream's `chunk` events carry `{"bytes": base64(<an
Anthropic stream event>)}`, whose `message_start` and `message_delta` say the usage as Anthropic
does, so the decoded event is what is handed over. The relay passes only whole frames, byte for
byte as they came, so that a stream the upstream breaks can be ended with one more frame, an
exception the SDKs raise on (`broken_frame`), never after half a frame. A stream whose frames do
not check is passed through as it comes and read no further.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from proxy.apis.bedrock.aws_event_stream import EventMessage, EventStreamDecoder, EventStreamError, encode_message

CONTENT_TYPE = "application/vnd.amazon.eventstream"
BROKEN_EXCEPTION = "modelStreamErrorException"  # a member of both streams' unions: boto3 raises EventStreamError


def broken_frame(message: str) -> bytes:
    """The exception frame that ends a stream the upstream broke."""
    headers = {":message-type": "exception", ":exception-type": BROKEN_EXCEPTION, ":content-type": "application/json"}
    return encode_message(headers, json.dumps({"message": message}).encode())


def converse_usage(payload: Mapping[str, Any]) -> tuple[int, int | None, int | None] | None:
    """Converse's usage (a whole answer's, a stream's `metadata`) as (prompt, output, cached):
    `inputTokens` leaves out what was read from or written to the cache, so both are added."""
    usage = payload.get("usage")
    if not isinstance(usage, Mapping) or "inputTokens" not in usage:
        return None
    prompt, output = _count(usage.get("inputTokens")), _count(usage.get("outputTokens"))
    if prompt is None:
        return None
    read, written = _count(usage.get("cacheReadInputTokens")), _count(usage.get("cacheWriteInputTokens"))
    return prompt + (read or 0) + (written or 0), output, read


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


class EventStreamFraming:
    """One AWS event stream (`proxy.apis.stream_errors.StreamFraming`): whole frames out, each
    event's payload (an InvokeModel chunk's Anthropic event, decoded) handed over."""

    def __init__(self) -> None:
        self.ended = False  # the stream's last event went through
        self._readable = True
        self._decoder = EventStreamDecoder()
        self._held = bytearray()  # the bytes of a frame not yet whole

    def feed(self, chunk: bytes) -> tuple[bytes, list[object]]:
        """What to forward of `chunk` now (the frames it completes) and their payloads."""
        if not self._readable:
            return chunk, []
        self._held += chunk
        payloads: list[object] = []
        try:
            for message in self._decoder.feed(chunk):
                payloads += self._read(message)
        except EventStreamError:  # not a stream the guard can read: passed on as it comes
            self._readable = False
            out, self._held = bytes(self._held), bytearray()
            return out, payloads
        whole = len(self._held) - self._decoder.pending
        out = bytes(self._held[:whole])
        del self._held[:whole]
        return out, payloads

    def finish(self) -> bytes:
        """What is left when the upstream ended: a partial frame, passed on for the SDK to refuse."""
        out, self._held = bytes(self._held), bytearray()
        return out

    def _read(self, message: EventMessage) -> list[object]:
        if message.message_type != "event":
            return []
        kind = message.event_type
        payload = _json(message.payload)
        if kind == "metadata":  # ConverseStream's last event
            self.ended = True
            return [payload]
        if kind != "chunk":
            return []
        encoded = payload.get("bytes")  # InvokeModelWithResponseStream: an Anthropic event inside
        if not isinstance(encoded, str):
            return []
        try:
            event = json.loads(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError, RecursionError):
            return []
        if isinstance(event, dict) and event.get("type") == "message_stop":
            self.ended = True
        return [event]


def _json(payload: bytes) -> dict[str, object]:
    try:
        value = json.loads(payload)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}
