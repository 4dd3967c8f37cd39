"""The event that ends a stream the upstream broke, in the grammar of the API the client speaks.

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
from typing import Any

BROKEN_CODE = "upstream_stream_broken"
ANTHROPIC_APIS = frozenset({"messages", "count_tokens"})


def broken_stream_event(api: str, message: str) -> bytes:
    """The SSE event that tells a client of `api` its stream broke, for `message`."""
    error: dict[str, Any] = {"message": message, "type": "upstream_error", "param": None, "code": BROKEN_CODE}
    if api in ANTHROPIC_APIS:
        data: dict[str, Any] = {"type": "error", "error": {"type": "api_error", "message": message}}
        return b"event: error\ndata: " + json.dumps(data).encode() + b"\n\n"
    if api.startswith("generate_content"):
        google = {"error": {"code": 502, "message": message, "status": "UNAVAILABLE"}}
        return b"data: " + json.dumps(google).encode() + b"\n\n"
    if api == "interactions":
        data = {"event_type": "error", "error": {"code": "unavailable", "message": message}}
        return b"event: error\ndata: " + json.dumps(data).encode() + b"\n\n"
    if api == "responses":
        data = {"type": "error", "code": BROKEN_CODE, "message": message, "param": None, "error": error}
        return b"event: error\ndata: " + json.dumps(data).encode() + b"\n\n"
    return b"data: " + json.dumps({"error": error}).encode() + b"\n\n"
