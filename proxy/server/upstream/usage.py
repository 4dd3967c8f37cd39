"""The `usage` an upstream reports: read from a whole answer, or tapped from a relayed stream.

`usage_from_body()` reads `usage` from a JSON response; `UsageTap` watches an SSE stream for its
usage chunk, and drops that chunk when the guard asked for it on the client's behalf
(`proxy.server.upstream.streams.ask_for_usage`). Usage calibrates estimated counts; the answer the
client gets is relayed byte for byte otherwise (`proxy.server.upstream.answers` drives both).
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from proxy.server.edge.decoding import decoded
from proxy.server.upstream.sse import event_data, event_end, json_or_none, may_name

# An event of a relayed stream larger than this is relayed as it comes, without being parsed: the
# tap holds at most this much of a partial event, and looks at each byte once.
MAX_EVENT_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int | None = None


def usage_of(payload: object) -> Usage | None:
    """The `usage` of a chat completion (or of one streamed chunk), if it has a prompt count."""
    usage = payload.get("usage") if isinstance(payload, dict) else None
    prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    if not isinstance(prompt, int) or isinstance(prompt, bool) or prompt < 0:
        return None
    completion = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return Usage(prompt, completion if isinstance(completion, int) and not isinstance(completion, bool) else None)


MAX_INFLATED_BODY = 16 * 1024 * 1024  # a compressed answer is read for its usage up to this much inflated


def usage_from_body(body: bytes, content_encoding: str | None = None) -> Usage | None:
    """The usage of a whole (non-streamed) response body, compressed or not (inflated at most
    `MAX_INFLATED_BODY`: past it, the JSON is cut and no usage is read)."""
    data = decoded(body, content_encoding, MAX_INFLATED_BODY)
    try:  # orjson alone, without the exact reader's walk over every value: only `usage` matters here
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        payload = None
    usage = payload.get("usage") if type(payload) is dict else None
    if payload is None or (type(usage) is dict and type(usage.get("prompt_tokens")) is float):
        payload = json_or_none(data)  # the exact reader: NaN and Infinity, a count past 64 bits
    return usage_of(payload)


class UsageTap:
    """Passes an SSE stream through, event by event, and keeps the usage it carries.

    With `strip` set, the usage-only chunk (`choices: []` and a `usage`) is dropped from the
    output. Event bytes are forwarded exactly as received; a partial event waits for its end.
    A compressed stream cannot be read: it is passed through as it is, and `usage` stays None.
    """

    def __init__(self, strip: bool, content_encoding: str | None = None) -> None:
        self.strip = strip
        self.usage: Usage | None = None
        self.ended = False  # the `[DONE]` event went through: what follows it is not the answer
        self.oversized = 0  # events over `MAX_EVENT_BYTES`, relayed unparsed
        self._readable = not (content_encoding or "").strip() or content_encoding == "identity"
        self._pending = bytearray()  # a partial event, at most MAX_EVENT_BYTES; never rescanned
        self._skipping = False  # inside an oversized event: relayed as it comes until it ends
        self._tail = b""  # while skipping, its last bytes (a terminator may straddle two chunks)

    def feed(self, chunk: bytes) -> bytes:
        """What to forward of `chunk` now."""
        if not self._readable:
            return chunk
        if self._skipping:
            return self._skip(chunk)
        if not self._pending and _passes_whole(chunk):
            return chunk
        text = self._pending
        whole = not text
        searched = max(0, len(text) - 3)  # what was held had no terminator: look only at what is new
        text += chunk
        kept: list[bytes] = []
        start = 0
        while True:
            end, size = event_end(text, max(start, searched))
            if end < 0:
                break
            event = bytes(text[start : end + size])
            if self._keep(event[: end - start]):
                kept.append(event)
            else:
                whole = False
            start = end + size
        self._pending = text[start:] if start else text
        if len(self._pending) > MAX_EVENT_BYTES:  # never parsed: relayed, and the rest of it as it comes
            kept.append(bytes(self._pending))
            self._tail, self._pending, self._skipping = bytes(self._pending[-3:]), bytearray(), True
            self.oversized += 1
            return b"".join(kept)
        if whole and not self._pending:  # every event of `chunk` kept, none partial: forwarded as it came
            return chunk
        return b"".join(kept)

    def _skip(self, chunk: bytes) -> bytes:
        """`chunk` inside an oversized event: relayed as it is; after the event's end, read again."""
        tail = self._tail
        end, size = event_end(tail + chunk[:3]) if tail else (-1, 0)  # a terminator across the seam
        if end >= 0:
            cut = end + size - len(tail)
        else:
            end, size = event_end(chunk)
            if end < 0:
                self._tail = (tail + chunk[-3:])[-3:]
                return chunk
            cut = end + size
        self._skipping, self._tail = False, b""
        rest = chunk[cut:]
        return chunk[:cut] + self.feed(rest) if rest else chunk[:cut]

    def finish(self) -> bytes:
        """What is left at the end of the stream (an event with no terminator)."""
        rest, self._pending = bytes(self._pending), bytearray()
        if rest and self._readable and not self._keep(rest):
            return b""
        return rest

    def _keep(self, event: bytes) -> bool:
        data = event_data(event)
        if data is not None and data.strip() == b"[DONE]":
            self.ended = True
            return True
        if data is None or not may_name(data, b"usage"):
            return True
        payload = json_or_none(data)
        usage = usage_of(payload)
        if usage is None:
            return True
        self.usage = usage
        return not (self.strip and isinstance(payload, dict) and payload.get("choices") == [])


def _passes_whole(chunk: bytes) -> bool:
    """Whether a chunk that starts an event goes on as it came without a look at its events: it
    ends one (with the usual terminator) and none of its events can be `[DONE]` or name `usage`,
    even escaped (the test `_keep` makes). Most deltas of a stream: five scans in C instead of
    splitting it into events."""
    return (
        chunk.endswith(b"\n\n")
        and b"\r" not in chunk
        and b"usage" not in chunk
        and b"\\u" not in chunk
        and b"[DONE]" not in chunk
    )
