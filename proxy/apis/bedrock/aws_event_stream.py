"""AWS event stream framing (`application/vnd.amazon.eventstream`): how Bedrock streams answers.

A message is a prelude (its total length, its headers' length, a CRC32 of those 8 bytes), the
headers (name, type, value), the payload and a CRC32 of everything before it, all big-endian.
Bedrock's headers say what the payload is: `:message-type` (`event` or `exception`),
`:event-type` (`messageStart`, `contentBlockDelta`, `metadata`, ...) or `:exception-type`, and
`:content-type`. A guard that relays a stream frame by frame must read each frame whole and
check it, so a corrupt or oversized frame is an error, never a guess.

    decoder = EventStreamDecoder(); for message in decoder.feed(chunk): ...
    encode_message({":message-type": "event", ":event-type": "metadata"}, payload)
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

# The limits AWS's SDKs enforce on a received message: a larger one is malformed, not buffered.
MAX_PAYLOAD = 16 * 1024 * 1024
MAX_HEADERS = 128 * 1024
_PRELUDE = struct.Struct(">III")
_MINIMUM = _PRELUDE.size + 4  # a message with no headers and no payload

HeaderValue = str | bytes | bool | int


class EventStreamError(ValueError):
    """A frame that is not a valid event-stream message (lengths, CRCs or headers)."""


@dataclass(frozen=True, slots=True)
class EventMessage:
    headers: Mapping[str, HeaderValue]
    payload: bytes

    @property
    def message_type(self) -> str:
        value = self.headers.get(":message-type")
        return value if isinstance(value, str) else ""

    @property
    def event_type(self) -> str:
        """The event's type, or the exception's for an exception message."""
        key = ":exception-type" if self.message_type == "exception" else ":event-type"
        value = self.headers.get(key)
        return value if isinstance(value, str) else ""


class EventStreamDecoder:
    """Whole messages out of a byte stream fed in arbitrary pieces."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> Iterator[EventMessage]:
        self._buffer += data
        while len(self._buffer) >= _PRELUDE.size:
            total, headers_length, prelude_crc = _PRELUDE.unpack_from(self._buffer)
            if zlib.crc32(self._buffer[:8]) != prelude_crc:
                raise EventStreamError("event stream: the prelude's CRC does not match")
            if headers_length > MAX_HEADERS or total - headers_length - _MINIMUM > MAX_PAYLOAD or total < _MINIMUM:
                raise EventStreamError(f"event stream: a message of {total} bytes is out of bounds")
            if total - headers_length < _MINIMUM:
                raise EventStreamError("event stream: the headers are longer than the message")
            if len(self._buffer) < total:
                return
            frame = bytes(self._buffer[:total])
            del self._buffer[:total]
            yield _message(frame, headers_length)

    @property
    def pending(self) -> int:
        """Bytes of an incomplete message still held."""
        return len(self._buffer)


def encode_message(headers: Mapping[str, HeaderValue], payload: bytes) -> bytes:
    """One message: string headers as strings, bytes as bytes, bools and ints (int32) as such."""
    encoded = b"".join(_header(name, value) for name, value in headers.items())
    total = _MINIMUM + len(encoded) + len(payload)
    prelude = struct.pack(">II", total, len(encoded))
    prelude += struct.pack(">I", zlib.crc32(prelude))
    body = prelude + encoded + payload
    return body + struct.pack(">I", zlib.crc32(body))


def _message(frame: bytes, headers_length: int) -> EventMessage:
    (expected,) = struct.unpack_from(">I", frame, len(frame) - 4)
    if zlib.crc32(frame[:-4]) != expected:
        raise EventStreamError("event stream: the message's CRC does not match")
    start = _PRELUDE.size
    headers = _headers(frame[start : start + headers_length])
    return EventMessage(headers, frame[start + headers_length : -4])


# Value type -> (struct format, size) for the fixed-size values.
_FIXED = {2: (">b", 1), 3: (">h", 2), 4: (">i", 4), 5: (">q", 8), 8: (">q", 8)}


def _headers(data: bytes) -> dict[str, HeaderValue]:
    headers: dict[str, HeaderValue] = {}
    at = 0
    try:
        while at < len(data):
            size = data[at]
            name = data[at + 1 : at + 1 + size].decode("utf-8")
            at += 1 + size
            kind = data[at]
            at += 1
            value: HeaderValue
            if kind in (0, 1):
                value = kind == 0
            elif kind in _FIXED:
                fmt, width = _FIXED[kind]
                (value,) = struct.unpack_from(fmt, data, at)
                at += width
            elif kind in (6, 7):
                (length,) = struct.unpack_from(">H", data, at)
                raw = data[at + 2 : at + 2 + length]
                if len(raw) != length:
                    raise EventStreamError("event stream: a header value runs past the headers")
                value = raw.decode("utf-8") if kind == 7 else raw
                at += 2 + length
            elif kind == 9:
                value = data[at : at + 16]
                at += 16
            else:
                raise EventStreamError(f"event stream: unknown header type {kind}")
            headers[name] = value
    except (IndexError, struct.error, UnicodeDecodeError) as exc:
        raise EventStreamError("event stream: malformed headers") from exc
    if at != len(data):
        raise EventStreamError("event stream: malformed headers")
    return headers


def _header(name: str, value: HeaderValue) -> bytes:
    raw = name.encode("utf-8")
    head = bytes([len(raw)]) + raw
    if isinstance(value, bool):
        return head + bytes([0 if value else 1])
    if isinstance(value, int):
        return head + bytes([4]) + struct.pack(">i", value)
    data = value.encode("utf-8") if isinstance(value, str) else value
    return head + bytes([7 if isinstance(value, str) else 6]) + struct.pack(">H", len(data)) + data
