"""What an upstream's answer reports: its usage, and what the provider now holds.

Every API spells its usage its own way; `usage_of()` reads any of them from a whole answer or from
one streamed event (chat completions' and legacy completions' `usage.prompt_tokens`, Responses'
`usage.input_tokens` (also inside `response.completed`), Interactions' `usage.total_input_tokens`,
Anthropic's `usage.input_tokens` plus its cache reads and writes (`message_start`, then
`message_delta`), Gemini's `usageMetadata` (`promptTokenCount`, `cachedContentTokenCount`,
`candidatesTokenCount`)).
`held_of()` reads what the answer says the provider keeps for a later request to name by id: a
stored response and the conversation it was added to (their size: the answer's input + output), an
interaction, a cached prompt (`cachedContents`: its `totalTokenCount`, until its `expireTime`).

`usage_from_body()` / `reported_from_body()` read a whole (non-streamed) answer; `UsageTap` watches
an SSE stream for them, and drops the usage chunk when the guard asked for it on the client's behalf
(`proxy.server.upstream.relay.ask_for_usage`). The answer the client gets is relayed byte for
byte otherwise (`proxy.server.upstream.relay` drives both).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.apis.stream_errors import StreamFraming
from proxy.server.edge.body import decoded
from proxy.wire.codec import loads

# Server-sent events, read part by part (also how `proxy.server.upstream.relay` reads a stream's first event).
_EVENT_END = (b"\r\n\r\n", b"\n\n", b"\r\r")


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


# An event of a relayed stream larger than this is relayed as it comes, without being parsed: the
# tap holds at most this much of a partial event, and looks at each byte once.
MAX_EVENT_BYTES = 1024 * 1024
MAX_HELD_ID_CHARS = 512  # an id longer than this is no provider's: not kept


@dataclass(frozen=True, slots=True)
class Usage:
    """The provider's count of one answer: the prompt (its cached part included), the part of it
    read from a cache, the output."""

    prompt_tokens: int
    completion_tokens: int | None = None
    cached_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class HeldReport:
    """Context the provider says it now holds, for a later request to name by `id`: `kind` is
    `response`, `conversation`, `interaction` or `cache` (`proxy.apis.base.HeldContext`'s kinds);
    `tokens` what it weighs in a prompt; `expires_at` (Unix seconds) when the provider lets it go."""

    kind: str
    id: str
    tokens: int
    expires_at: float | None = None


# An API shape's own spelling of an answer's usage (`Adapter.answer_usage`): (prompt, output, cached).
Spelling = Callable[[Mapping[str, Any]], tuple[int, int | None, int | None] | None]


@dataclass(slots=True)
class Reported:
    """What an answer reported: its usage (merged across a stream's events) and what is held
    (`spelled`: the usage as the answer's shape spells it, where no other shape does)."""

    usage: Usage | None = None
    held: list[HeldReport] = field(default_factory=list)
    spelled: Spelling | None = None

    def add(self, payload: object) -> bool:
        """Take in one answer or event; whether it carried usage."""
        found = usage_of(payload)
        if found is None and self.spelled is not None and type(payload) is dict:
            own = self.spelled(payload)
            found = Usage(*own) if own is not None else None
        if found is not None:
            self.usage = _merged(self.usage, found)
        self.held += held_of(payload, found if found is not None else self.usage)
        return found is not None


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _merged(before: Usage | None, after: Usage) -> Usage:
    """A stream's later usage over its earlier one: Anthropic's `message_delta` says the output,
    its `message_start` the prompt; what a later event leaves out, an earlier one said."""
    if before is None:
        return after
    return Usage(
        after.prompt_tokens or before.prompt_tokens,
        after.completion_tokens if after.completion_tokens is not None else before.completion_tokens,
        after.cached_tokens if after.cached_tokens is not None else before.cached_tokens,
    )


def _inner(payload: dict[str, object]) -> dict[str, object]:
    """The answer inside a streamed event that wraps it (`response.completed`, `message_start`)."""
    for key in ("response", "message", "interaction"):
        inner = payload.get(key)
        if type(inner) is dict and ("usage" in inner or "id" in inner):
            return inner
    return payload


def usage_of(payload: object) -> Usage | None:
    """The usage of any API's answer (or of one streamed event), if it says a prompt count; an
    Anthropic `message_delta` that says only the output is a usage with a prompt of 0 (merged)."""
    if type(payload) is not dict:
        return None
    usage = payload.get("usage")
    if type(usage) is dict and "prompt_tokens" in usage:  # chat and legacy completions: most answers
        prompt = _count(usage["prompt_tokens"])
        if prompt is None:
            return None
        details = usage.get("prompt_tokens_details")
        cached = _count(details.get("cached_tokens")) if type(details) is dict else None
        return Usage(prompt, _count(usage.get("completion_tokens")), cached)
    if usage is None:
        meta = payload.get("usageMetadata")
        if type(meta) is dict:  # Gemini: the prompt with its cached part, the candidates
            prompt = _count(meta.get("promptTokenCount"))
            if prompt is None:
                return None
            return Usage(prompt, _count(meta.get("candidatesTokenCount")), _count(meta.get("cachedContentTokenCount")))
        usage = _inner(payload).get("usage")
    return _input_usage(usage, payload.get("type") == "message_delta") if type(usage) is dict else None


def _input_usage(usage: dict[str, object], delta: bool) -> Usage | None:
    """A usage spelled with input tokens: Responses', Anthropic's, Interactions'."""
    if "total_input_tokens" in usage:  # Interactions
        prompt = _count(usage.get("total_input_tokens"))
        if prompt is None:
            return None
        return Usage(prompt, _count(usage.get("total_output_tokens")), _count(usage.get("total_cached_tokens")))
    prompt = _count(usage.get("input_tokens"))
    output = _count(usage.get("output_tokens"))
    if prompt is None:
        return Usage(0, output) if output is not None and delta else None
    read, written = _count(usage.get("cache_read_input_tokens")), _count(usage.get("cache_creation_input_tokens"))
    if read is not None or written is not None:  # Anthropic: input_tokens leaves the cache's tokens out
        return Usage(prompt + (read or 0) + (written or 0), output, read)
    details = usage.get("input_tokens_details")  # Responses: input_tokens counts the cached ones too
    cached = _count(details.get("cached_tokens")) if type(details) is dict else None
    return Usage(prompt, output, cached)


def held_of(payload: object, usage: Usage | None) -> list[HeldReport]:
    """What `payload` says the provider now holds: a completed Response (and the conversation it
    joined), an Interaction, a cached content (`cachedContents` create or get)."""
    if type(payload) is not dict:
        return []
    kind = payload.get("object")
    if kind is None:  # a streamed event wrapping its answer, or a cache
        name = payload.get("name")
        if type(name) is str:
            return _cache(payload, name)
        payload = _inner(payload)
        kind = payload.get("object")
    usage_spelled = payload.get("usage")
    if kind is None and type(usage_spelled) is dict and "total_input_tokens" in usage_spelled:
        kind = "interaction"  # an Interaction says its kind by its usage's spelling where it names none
    if kind != "response" and kind != "interaction":
        return []
    ident = payload.get("id")
    if type(ident) is not str or usage is None or not 0 < len(ident) <= MAX_HELD_ID_CHARS:
        return []
    if payload.get("status") not in (None, "completed"):
        return []
    tokens = usage.prompt_tokens + (usage.completion_tokens or 0)
    held = [HeldReport(str(kind), ident, tokens)]
    conversation = payload.get("conversation")
    conversation = conversation.get("id") if type(conversation) is dict else conversation
    if type(conversation) is str and 0 < len(conversation) <= MAX_HELD_ID_CHARS:
        held.append(HeldReport("conversation", conversation, tokens))
    return held


def _cache(payload: dict[str, object], name: str) -> list[HeldReport]:
    """A cached content's size (`totalTokenCount`) and expiry, as its create or get answer says."""
    meta = payload.get("usageMetadata")
    tokens = _count(meta.get("totalTokenCount")) if type(meta) is dict else None
    if tokens is None or "cachedContents/" not in name or len(name) > MAX_HELD_ID_CHARS:
        return []
    return [HeldReport("cache", name, tokens, _expiry(payload.get("expireTime")))]


def _expiry(value: object) -> float | None:
    """Google's `expireTime` (RFC 3339, `Z` or an offset, up to nanoseconds) as Unix seconds."""
    if not isinstance(value, str) or len(value) > 64:
        return None
    text = value.replace("Z", "+00:00")
    whole, dot, rest = text.partition(".")
    if dot:  # Python reads at most microseconds: the digits past them go
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = f"{whole}.{rest[: min(digits, 6)]}{rest[digits:]}"
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


MAX_INFLATED_BODY = 16 * 1024 * 1024  # a compressed answer is read for its usage up to this much inflated


def reported_from_body(body: bytes, content_encoding: str | None = None, spelled: Spelling | None = None) -> Reported:
    """What a whole (non-streamed) response body reports, compressed or not (inflated at most
    `MAX_INFLATED_BODY`: past it, the JSON is cut and nothing is read). A body that is a JSON array
    (Gemini's stream without `alt=sse`) reports what its pieces report, in order."""
    data = decoded(body, content_encoding, MAX_INFLATED_BODY)
    try:  # orjson alone, without the exact reader's walk over every value: only `usage` matters here
        payload = orjson.loads(data)
    except orjson.JSONDecodeError:
        payload = None
    usage = payload.get("usage") if type(payload) is dict else None
    if payload is None or (type(usage) is dict and type(usage.get("prompt_tokens")) is float):
        payload = json_or_none(data)  # the exact reader: NaN and Infinity, a count past 64 bits
    reported = Reported(spelled=spelled)
    for piece in payload if isinstance(payload, list) else (payload,):
        reported.add(piece)
    return reported


def usage_from_body(body: bytes, content_encoding: str | None = None) -> Usage | None:
    """The usage of a whole (non-streamed) response body (`reported_from_body`'s)."""
    return reported_from_body(body, content_encoding).usage


class FramedTap:
    """Passes a stream in its shape's own framing through (`StreamFraming`: whole frames) and keeps
    the usage its payloads carry."""

    def __init__(self, framing: StreamFraming, spelled: Spelling | None = None) -> None:
        self.framing, self.reported = framing, Reported(spelled=spelled)

    @property
    def ended(self) -> bool:
        return self.framing.ended

    def feed(self, chunk: bytes) -> bytes:
        out, payloads = self.framing.feed(chunk)
        for payload in payloads:
            self.reported.add(payload)
        return out

    def finish(self) -> bytes:
        return self.framing.finish()


class UsageTap:
    """Passes an SSE stream through, event by event, and keeps the usage it carries.

    With `strip` set, the usage-only chunk (`choices: []` and a `usage`) is dropped from the
    output. Event bytes are forwarded exactly as received; a partial event waits for its end.
    A compressed stream cannot be read: it is passed through as it is, and `usage` stays None.
    """

    def __init__(self, strip: bool, content_encoding: str | None = None, spelled: Spelling | None = None) -> None:
        self.strip = strip
        self.reported = Reported(spelled=spelled)
        self.ended = False  # the `[DONE]` event went through: what follows it is not the answer
        self.oversized = 0  # events over `MAX_EVENT_BYTES`, relayed unparsed
        self._readable = not (content_encoding or "").strip() or content_encoding == "identity"
        self._pending = bytearray()  # a partial event, at most MAX_EVENT_BYTES; never rescanned
        self._skipping = False  # inside an oversized event: relayed as it comes until it ends
        self._tail = b""  # while skipping, its last bytes (a terminator may straddle two chunks)

    @property
    def usage(self) -> Usage | None:
        return self.reported.usage

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
        if not self.reported.add(payload):
            return True
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
