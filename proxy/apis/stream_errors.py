"""A shape's stream: the event that ends one the upstream broke, in the grammar of the API the
client speaks (each adapter's `broken_stream_event` picks its own here), and the framing of a
stream that is not server-sent events (`StreamFraming`, an adapter's `stream_framing`).

Once a stream has begun, its status (200) and first events are with the client; a failure can
only be said by one more event, and it must be the one that client's SDK raises on, or the
partial answer passes for a whole one:

    chat, completions   `data: {"error": {...}}`: the openai SDK raises `APIError` on any event
                        whose data holds an `error` object
    responses           `event: error` with the Responses error event's fields (`type`, `code`,
                        `message`, `param`) and the same `error` object, on which the openai SDK
                        (and so the Agents SDK) raises
    messages            `event: error` with `{"type": "error", "error": {"type", "message"}}`:
                        the anthropic SDK skips unnamed events and raises on this one
    generate_content    `data: {"error": {"code", "message", "status"}}`: google-genai raises
                        `APIError` (by its code) on any chunk that is Google's error object
    interactions        `event: error` with `{"event_type": "error", "error": {"code", "message"}}`:
                        the Interactions stream's own error event
"""

from __future__ import annotations

import json
from typing import Any, Protocol

BROKEN_CODE = "upstream_stream_broken"


class StreamFraming(Protocol):
    """One streamed answer in a framing of its shape's own (AWS's event stream, frames of binary
    headers and a JSON payload): the relay forwards what `feed` returns, whole frames only, and
    reads the usage from the payloads it found; `ended` once the answer's last frame went by."""

    ended: bool

    def feed(self, chunk: bytes) -> tuple[bytes, list[object]]:
        """What to forward of `chunk` now, and the payloads of the frames it completed."""
        ...

    def finish(self) -> bytes:
        """What is left at the end of the stream."""
        ...


def _openai_error(message: str) -> dict[str, Any]:
    return {"message": message, "type": "upstream_error", "param": None, "code": BROKEN_CODE}


def openai_broken(message: str) -> bytes:
    """Chat completions' and legacy completions' event: an `error` object in an unnamed event."""
    return b"data: " + json.dumps({"error": _openai_error(message)}).encode() + b"\n\n"


def responses_broken(message: str) -> bytes:
    data = {"type": "error", "code": BROKEN_CODE, "message": message, "param": None, "error": _openai_error(message)}
    return b"event: error\ndata: " + json.dumps(data).encode() + b"\n\n"


def anthropic_broken(message: str) -> bytes:
    data = {"type": "error", "error": {"type": "api_error", "message": message}}
    return b"event: error\ndata: " + json.dumps(data).encode() + b"\n\n"


def google_broken(message: str) -> bytes:
    google = {"error": {"code": 502, "message": message, "status": "UNAVAILABLE"}}
    return b"data: " + json.dumps(google).encode() + b"\n\n"


def interactions_broken(message: str) -> bytes:
    data = {"event_type": "error", "error": {"code": "unavailable", "message": message}}
    return b"event: error\ndata: " + json.dumps(data).encode() + b"\n\n"
