"""Bedrock's streamed answers (AWS event streams) relayed frame by frame and read for their usage.

ConverseStream ends with a `metadata` event whose `usage` is the provider's count
(`inputTokens`, `outputTokens`, `cacheReadInputTokens`, `cacheWriteInputTokens`);
InvokeModelWithResponseStream's `chunk` events carry `{"bytes": base64(<an Anthropic stream
event>)}`, whose `message_start` and `message_delta` say the usage as Anthropic does. The relay
passes only whole frames, byte for byte as they came, so that a stream the upstream breaks can be
ended with one more frame, an exception the SDKs raise on (`broken_frame`), never after half a
frame. A compressed stream, or one whose frames do not check, is passed through as it comes and
read no further.
"""

from __future__ import annotations

import base64
import binascii
import json

import aiohttp

from proxy.apis.bedrock.aws_event_stream import EventMessage, EventStreamDecoder, EventStreamError, encode_message
from proxy.server.upstream.usage import Reported, converse_usage

CONTENT_TYPE = "application/vnd.amazon.eventstream"
BROKEN_EXCEPTION = "modelStreamErrorException"  # a member of both streams' unions: boto3 raises EventStreamError


def is_aws_event_stream(response: aiohttp.ClientResponse) -> bool:
    return response.headers.get("Content-Type", "").startswith(CONTENT_TYPE)


def broken_frame(message: str) -> bytes:
    """The exception frame that ends a stream the upstream broke."""
    headers = {":message-type": "exception", ":exception-type": BROKEN_EXCEPTION, ":content-type": "application/json"}
    return encode_message(headers, json.dumps({"message": message}).encode())


class EventStreamTap:
    """Passes an event stream through in whole frames and keeps the usage its frames report."""

    def __init__(self, content_encoding: str | None = None) -> None:
        self.reported = Reported()
        self.ended = False  # the stream's last event went through
        self._readable = (content_encoding or "identity").strip().lower() == "identity"
        self._decoder = EventStreamDecoder()
        self._held = bytearray()  # the bytes of a frame not yet whole

    def feed(self, chunk: bytes) -> bytes:
        """What to forward of `chunk` now: the frames it completes."""
        if not self._readable:
            return chunk
        self._held += chunk
        try:
            for message in self._decoder.feed(chunk):
                self._read(message)
        except EventStreamError:  # not a stream the guard can read: passed on as it comes
            self._readable = False
            out, self._held = bytes(self._held), bytearray()
            return out
        whole = len(self._held) - self._decoder.pending
        out = bytes(self._held[:whole])
        del self._held[:whole]
        return out

    def finish(self) -> bytes:
        """What is left when the upstream ended: a partial frame, passed on for the SDK to refuse."""
        out, self._held = bytes(self._held), bytearray()
        return out

    def _read(self, message: EventMessage) -> None:
        if message.message_type != "event":
            return
        kind = message.event_type
        if kind == "metadata":  # ConverseStream's last event
            self.ended = True
            usage = _json(message.payload).get("usage")
            if isinstance(usage, dict):
                found = converse_usage(usage)
                if found is not None:
                    self.reported.usage = found
        elif kind == "chunk":  # InvokeModelWithResponseStream: an Anthropic event inside
            encoded = _json(message.payload).get("bytes")
            if not isinstance(encoded, str):
                return
            try:
                event = json.loads(base64.b64decode(encoded, validate=True))
            except (binascii.Error, ValueError):
                return
            self.reported.add(event)
            if isinstance(event, dict) and event.get("type") == "message_stop":
                self.ended = True


def _json(payload: bytes) -> dict[str, object]:
    try:
        value = json.loads(payload)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
