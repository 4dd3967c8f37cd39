"""What the guard's own context edits cleared, written into the upstream's answer where Anthropic
puts it (`context_management.applied_edits`), for an upstream that speaks Messages but cannot edit.

A whole answer (a message's JSON) gets the field at its top level; a stream gets it in its
`message_delta` event, beside `delta` and `usage`, as Anthropic sends it. Anything else (an
error, a body that is not a message, an event that is not the delta) passes as it came. Only the
stream's events are parsed, one at a time: every other byte is relayed as soon as it is read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

_EVENT_ENDS = (b"\n\n", b"\r\n\r\n")


class WholeAnswer:
    """A whole message answer, held until its end and written once with `fields` added."""

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self.fields = fields
        self._body = bytearray()

    def feed(self, chunk: bytes) -> bytes:
        self._body += chunk
        return b""

    def finish(self) -> bytes:
        body = bytes(self._body)
        try:
            message = json.loads(body)
        except ValueError:
            return body
        if not isinstance(message, dict) or message.get("type") != "message":
            return body
        return json.dumps({**message, **self.fields}, ensure_ascii=False).encode()


class StreamedAnswer:
    """A message stream relayed event by event, `fields` added to its `message_delta` event."""

    def __init__(self, fields: Mapping[str, Any]) -> None:
        self.fields = fields
        self._held = b""  # the start of an event not complete yet
        self._done = False  # the delta event was amended: the rest passes untouched

    def feed(self, chunk: bytes) -> bytes:
        if self._done:
            return chunk
        data = self._held + chunk
        out: list[bytes] = []
        while True:
            end, size = _event_end(data)
            if end < 0:
                break
            event, data = data[: end + size], data[end + size :]
            out.append(self._amended(event))
            if self._done:
                out.append(data)
                data = b""
                break
        self._held = data
        return b"".join(out)

    def finish(self) -> bytes:
        held, self._held = self._held, b""
        return held if self._done or not held else self._amended(held)

    def _amended(self, event: bytes) -> bytes:
        if b"message_delta" not in event:
            return event
        lines = event.split(b"\n")
        for k, line in enumerate(lines):
            if not line.startswith(b"data:"):
                continue
            try:
                data = json.loads(line[5:])
            except ValueError:
                return event
            if not isinstance(data, dict) or data.get("type") != "message_delta":
                return event
            ending = b"\r" if line.endswith(b"\r") else b""
            lines[k] = b"data: " + json.dumps({**data, **self.fields}, ensure_ascii=False).encode() + ending
            self._done = True
            return b"\n".join(lines)
        return event


def _event_end(data: bytes) -> tuple[int, int]:
    """Where the first complete event in `data` ends, and the size of the blank line ending it."""
    found = [(at, len(end)) for end in _EVENT_ENDS if (at := data.find(end)) >= 0]
    return min(found) if found else (-1, 0)
