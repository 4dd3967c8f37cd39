"""Reading an upstream's server-sent events: the first one before committing, and each one's parts.

Some servers send `200` and then nothing (llama-cpp-python on an over-window stream), or `200` and
then an error event. `peek_first_event()` reads up to the first complete SSE event (or the first
bytes of any other body) and says which it is: data, an error, or an empty body. Until the client's
response is prepared, the handler can still retry or answer an error; the bytes read are relayed
first (`proxy.server.upstream.answers`). The event parsing here (`event_end`, `event_data`,
`may_name`) is also what the usage tap reads a relayed stream with (`proxy.server.upstream.usage`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp

from proxy.server.edge.body import Decoder
from proxy.wire.codec import loads

MAX_PEEK_BYTES = 256 * 1024  # a first event larger than this is relayed as data, unread
_EVENT_END = (b"\r\n\r\n", b"\n\n", b"\r\r")

FirstKind = Literal["data", "error", "empty"]


@dataclass(frozen=True, slots=True)
class FirstEvent:
    """What an upstream response began with. `head` holds every byte read, as received."""

    kind: FirstKind
    head: bytes
    error: Mapping[str, Any] | None = None  # the error object of an error event

    @property
    def message(self) -> str:
        """The error's message, or a sentence saying the body was empty."""
        if self.kind == "empty":
            return "the upstream answered with an empty body"
        message = self.error.get("message") if self.error else None
        return message if isinstance(message, str) else "the upstream's stream began with an error event"


def is_event_stream(response: aiohttp.ClientResponse) -> bool:
    return response.headers.get("Content-Type", "").startswith("text/event-stream")


async def peek_first_event(response: aiohttp.ClientResponse, max_bytes: int = MAX_PEEK_BYTES) -> FirstEvent:
    """Read `response` up to its first SSE event with data (skipping comments such as keep-alive
    pings), or, for any other body, its first bytes; and classify it. aiohttp's errors pass through."""
    decode = Decoder(response.headers.get("Content-Encoding"))
    stream = is_event_stream(response)
    head = bytearray()
    text = bytearray()
    start = searched = 0  # where the next event starts; how far terminators were looked for
    while len(head) < max_bytes and len(text) < max_bytes:
        chunk = await response.content.readany()
        if not chunk:
            break
        head += chunk
        text += decode(chunk, max_bytes - len(text) + 1)
        if not stream:
            return _classify_body(bytes(head), bytes(text))
        while True:  # each byte is looked at once, whatever the chunks' sizes
            end, size = event_end(text, max(start, searched - 3))
            if end < 0:
                break
            event = bytes(text[start:end])
            start = end + size
            data = event_data(event)
            if data is not None:
                return _classify_event(bytes(head), event, data)
        searched = len(text)
    if not text.strip():
        return FirstEvent("empty", bytes(head))
    if stream:
        # The body ended (or grew too long) before a complete event: classify what there is.
        data = event_data(bytes(text))
        if data is not None and _error_of(data) is not None:
            return _classify_event(bytes(head), bytes(text), data)
    return FirstEvent("data", bytes(head))


def _classify_body(head: bytes, text: bytes) -> FirstEvent:
    return FirstEvent("data", head) if text.strip() else FirstEvent("empty", head)


def _classify_event(head: bytes, event: bytes, data: bytes) -> FirstEvent:
    error = _error_of(data)
    if error is None and _event_name(event) == "error":
        error = {"message": data.decode("utf-8", "replace")}
    return FirstEvent("error", head, error) if error is not None else FirstEvent("data", head)


def event_end(text: bytes | bytearray, start: int = 0) -> tuple[int, int]:
    """Where the first event terminator in `text` at or after `start` is, and its length; (-1, 0)
    if there is none."""
    if text.find(b"\r", start) < 0:  # the usual case: one terminator to look for
        end = text.find(b"\n\n", start)
        return (end, 2) if end >= 0 else (-1, 0)
    found = [(i, len(sep)) for sep in _EVENT_END if (i := text.find(sep, start)) >= 0]
    return min(found) if found else (-1, 0)


def event_data(event: bytes) -> bytes | None:
    """The `data:` of one SSE event (lines joined by newlines), or None for a comment-only event."""
    if event.startswith(b"data: ") and b"\n" not in event and b"\r" not in event:
        return event[6:]  # the usual event: one data line
    lines = [line[5:].removeprefix(b" ") for line in event.splitlines() if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def _event_name(event: bytes) -> str | None:
    for line in event.splitlines():
        if line.startswith(b"event:"):
            return line[6:].strip().decode("utf-8", "replace")
    return None


def json_or_none(data: bytes) -> Any:
    """`data` parsed as JSON, or None when it is not JSON."""
    try:
        return loads(data)
    except ValueError:
        return None


def may_name(data: bytes, key: bytes) -> bool:
    """False when the JSON text `data` cannot hold the key `key`: it is not there as written, and
    no `\\u` escape could spell it. Saves parsing events that are not what is looked for."""
    return key in data or b"\\u" in data


def _error_of(data: bytes) -> Mapping[str, Any] | None:
    if not may_name(data, b"error"):
        return None
    payload = json_or_none(data)
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict):
        return error
    if isinstance(error, str):
        return {"message": error}
    return None

