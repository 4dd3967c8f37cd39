"""Reading an upstream's response before the client sees any of it, and the `usage` it carries.

Three things a relay needs that a plain byte pipe cannot give:

- **The first event, before committing.** Some servers send `200` and then nothing (llama-cpp-python
  on an over-window stream), or `200` and then an error event. `peek_first_event()` reads up to the
  first complete SSE event (or the first bytes of any other body) and says which it is: data, an
  error, or an empty body. Until the client's response is prepared, the handler can still retry or
  answer an error; the bytes read are replayed first by `replay()`.
- **Usage.** `usage_from_body()` reads `usage` from a JSON response; `UsageTap` watches an SSE
  stream for its usage chunk, and drops that chunk when the guard asked for it on the client's
  behalf (`ask_for_usage()` adds `stream_options.include_usage` to a stream that did not).
- **Stale pooled connections.** A kept-alive connection the server closed fails the next request
  before a byte of response (`ServerDisconnectedError`); aiohttp retries that only for idempotent
  methods. `send_retrying_stale()` sends a POST once more on a fresh connection, of a session
  made as `upstream_session()` makes the app's (no cookie jar shared between clients).
"""

from __future__ import annotations

import errno
import zlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
from yarl import URL

from proxy.wire.codec import loads

MAX_PEEK_BYTES = 256 * 1024  # a first event larger than this is relayed as data, unread
# An event of a relayed stream larger than this is relayed as it comes, without being parsed: the
# tap holds at most this much of a partial event, and looks at each byte once.
MAX_EVENT_BYTES = 1024 * 1024
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


class _Decoder:
    """Undoes gzip or deflate for reading only; the bytes relayed stay as received."""

    def __init__(self, content_encoding: str | None) -> None:
        encoding = (content_encoding or "").strip().lower()
        wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}.get(encoding)
        self._inflate = zlib.decompressobj(wbits) if wbits is not None else None

    def __call__(self, chunk: bytes, max_length: int = 0) -> bytes:
        """`chunk` inflated (at most `max_length` bytes of it when given: a small compressed
        chunk can inflate a thousandfold)."""
        if self._inflate is None:
            return chunk
        try:
            return self._inflate.decompress(chunk, max(0, max_length))
        except zlib.error:
            self._inflate = None  # not what it said it was: read the rest as it comes
            return chunk


async def peek_first_event(response: aiohttp.ClientResponse, max_bytes: int = MAX_PEEK_BYTES) -> FirstEvent:
    """Read `response` up to its first SSE event with data (skipping comments such as keep-alive
    pings), or, for any other body, its first bytes; and classify it. aiohttp's errors pass through."""
    decode = _Decoder(response.headers.get("Content-Encoding"))
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
            end, size = _event_end(text, max(start, searched - 3))
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


def _event_end(text: bytes | bytearray, start: int = 0) -> tuple[int, int]:
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


def _json(data: bytes) -> Any:
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
    payload = _json(data)
    error = payload.get("error") if isinstance(payload, dict) else None
    if isinstance(error, dict):
        return error
    if isinstance(error, str):
        return {"message": error}
    return None


async def replay(head: bytes, response: aiohttp.ClientResponse) -> AsyncIterator[bytes]:
    """The bytes `peek_first_event()` read, then the rest of the response as it arrives."""
    if head:
        yield head
    async for chunk in response.content.iter_any():
        yield chunk


async def tapped(chunks: AsyncIterator[bytes], tap: UsageTap) -> AsyncIterator[bytes]:
    """`chunks` through `tap`: usage recorded, the usage chunk dropped if the tap strips it."""
    async for chunk in chunks:
        out = tap.feed(chunk)
        if out:
            yield out
    rest = tap.finish()
    if rest:
        yield rest


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
    return usage_of(_json(_Decoder(content_encoding)(body, MAX_INFLATED_BODY)))


def ask_for_usage(body: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """`body` with `stream_options.include_usage` set when it streams and did not ask for usage;
    and whether it was added (so the usage chunk is stripped from what the client sees)."""
    if body.get("stream") is not True:
        return dict(body), False
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        return dict(body), False  # malformed: the upstream answers it, as the client sent it
    if options and "include_usage" in options:
        return dict(body), False
    return {**body, "stream_options": {**(options or {}), "include_usage": True}}, True


def overflow_probe(body: Mapping[str, Any]) -> dict[str, Any]:
    """What to send when a stream came back empty from a server that answers an over-window
    stream that way (llama-cpp-python): the same prompt, not streamed, for one token. An
    overflow is refused before any generation, and this time the error says the window and
    the server's count, so the guard can self-correct as for any other overflow."""
    probe = {k: v for k, v in body.items() if k not in ("stream", "stream_options", "max_completion_tokens")}
    return {**probe, "max_tokens": 1}


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
            end, size = _event_end(text, max(start, searched))
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
        end, size = _event_end(tail + chunk[:3]) if tail else (-1, 0)  # a terminator across the seam
        if end >= 0:
            cut = end + size - len(tail)
        else:
            end, size = _event_end(chunk)
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
        payload = _json(data)
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


def upstream_session(connector: aiohttp.BaseConnector) -> aiohttp.ClientSession:
    """A session for calls upstream on behalf of many clients: bytes relayed as they come (no
    decompression), no proxy settings from the environment, and nothing added that changes what
    comes back:
    - no `Accept-Encoding` unless the client sent one (aiohttp adds `gzip, deflate`): a client
      that did not ask for a compressed answer must not be relayed one;
    - no cookie jar. A jar would keep the cookies one client's answer set and send them with
      every other client's requests to that host (aiohttp's default jar does, for any host that
      is not an IP address); a client's own `Cookie` header is forwarded as given, and an
      upstream's `Set-Cookie` relayed to it."""
    return aiohttp.ClientSession(
        connector=connector,
        auto_decompress=False,
        trust_env=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        skip_auto_headers=("Accept-Encoding",),
    )


# A pooled connection the server has closed fails in one of these ways before any response byte.
_STALE_ERRNOS = frozenset({errno.ECONNRESET, errno.EPIPE, errno.ECONNABORTED})


def is_stale_connection(exc: BaseException) -> bool:
    """True for a failure that a fresh connection would not have: the server closed the pooled
    one. A refused connection, a DNS failure or a timeout is not that."""
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return True
    if isinstance(exc, aiohttp.ClientConnectorError):
        return False
    return isinstance(exc, aiohttp.ClientOSError) and exc.errno in _STALE_ERRNOS


@dataclass(slots=True)
class Sent:
    """An upstream response, and whether it took a second attempt on a fresh connection."""

    response: aiohttp.ClientResponse
    retried: bool = False
    fresh: aiohttp.ClientSession | None = None  # the one-off session of that second attempt

    async def close(self) -> None:
        """Release the response (its connection goes back to the pool, or closes), then the
        one-off session, if there was one."""
        try:
            self.response.release()
            await self.response.wait_for_close()
        finally:
            if self.fresh is not None:
                await self.fresh.close()


async def send_retrying_stale(session: aiohttp.ClientSession, method: str, url: str | URL, **kwargs: Any) -> Sent:
    """`session.request(method, url, **kwargs)`, sent once more on a new connection (never a
    pooled one) if the first attempt failed on a connection the server had already closed.
    The caller closes what it returns (`Sent.close`)."""
    try:
        return Sent(await session.request(method, url, **kwargs))
    except aiohttp.ClientError as exc:
        if not is_stale_connection(exc):
            raise
    fresh = upstream_session(aiohttp.TCPConnector(force_close=True))
    try:
        return Sent(await fresh.request(method, url, **kwargs), retried=True, fresh=fresh)
    except BaseException:
        await fresh.close()
        raise
