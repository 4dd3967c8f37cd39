"""A request body read, held, decoded and refused: within a deadline, the size limit and the
memory budget, inflated when compressed, and a bad body of any layer turned into one 400. Also the
proxy's one content decoder.

The app turns off aiohttp's own request decompression (`auto_decompress=False`), because aiohttp
inflates on the event loop, as bytes arrive, before the handler (or the client-key check) has
run: a 1 MB gzip bomb that inflates to 1 GiB stalled every request, even when its answer was
401. Here, instead:

- the client-key middleware has already run: nothing is inflated for an unauthorised caller;
- the compressed bytes are read under `server.max_body_bytes` and a deadline
  (`server.body_timeout_seconds`): a client that sends half a body and waits gets 408, not a held socket;
- inflation runs in the large-body threads (`proxy.server.threads.placement`: one per core, a
  client's fair share of them, taken before inflating) and stops one byte past `max_body_bytes`
  (413): the cap bounds the work done and the memory held, not just the answer;
- the decoded body is what is counted *and* forwarded (the outgoing headers drop
  `Content-Encoding`, and the length is the decoded length).

**The bytes held** (`BodyBudget`). A body's bytes are taken from the process's budget as they come
(the announced `Content-Length` before any is read, a chunked body chunk by chunk) and as they are
inflated (in the thread that inflates), and given back, all at once, when the request ends, however
it ends: answered, refused, or its client gone (aiohttp cancels the handler when the connection
closes). The compressed bytes stay counted beside the inflated ones. One client (its credential,
else its address: `client_key`) holds at most `per_client` bytes, past which its next body gets 429
and `Retry-After` while others are still served; past `total` bytes any body gets 503 `overloaded`:
the guard says it is busy instead of growing until the kernel kills it. What a held body costs
beyond its bytes (its parse, its count) grows with it: docs/security.md ("The memory bound") writes
down and measures the memory this bounds. Counted under a lock: the inflating thread takes while the
event loop gives back.

**The decoder** serves three readers, each with its own bound on what inflation may produce (a
small compressed body can inflate a thousandfold): a client's request body is inflated whole and
strictly (`inflate_within`: corrupt, truncated or trailing data is an error, and so is output past
the limit); an upstream's answer, read as it is relayed for its first event and usage, and an
upstream's error body, read for its message, are decoded leniently, chunk by chunk, and what does
not decode is read as it came (`Decoder`, `decoded`); the bytes relayed are never the decoded ones.
gzip (several members too), `x-gzip` and deflate (zlib-wrapped, or raw as some clients send it) are
understood when inflating strictly, gzip and zlib-wrapped deflate when reading leniently. Other
request encodings get 415; br and zstd would be added here with a decoder library.

**A bad body.** The layers below the server raise one type for a body they refuse,
`proxy.core.plan.BodyError`, and know nothing of HTTP; `bad_body_errors()` wraps every place the
server (and the CLI) reads or parses a body and turns one into `BadRequest` (400) with the message
and the field it names, in one context manager (httpx's `map_httpcore_exceptions()` is the model).
"""

from __future__ import annotations

import asyncio
import math
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from aiohttp import web

from proxy.core.plan import BodyError
from proxy.core.work_budget import checkpoint
from proxy.errors import BadRequest, Overloaded, PayloadTooLarge, RequestTimeout, TooManyRequests, UnsupportedEncoding
from proxy.server.edge.credentials import credential_digest
from proxy.server.threads.placement import client_key, large_body_slots
from proxy.wire.readers import read_chat_body

MIB = 1024 * 1024


@dataclass(frozen=True)
class BodyLimits:
    """`total`: bytes of request bodies held at once by the process (compressed and inflated
    counted); `per_client`: what one client may hold of it; `retry_after`: seconds a refused
    client is told to wait (the time a body of the limit takes to be counted and answered)."""

    total: int
    per_client: int
    retry_after: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.per_client <= self.total:
            raise ValueError(f"a client's share ({self.per_client:,}) must be positive and within the total")


class BodyBudget:
    """The bytes held now, in all and per client; `hold(client)` opens one request's account."""

    def __init__(self, limits: BodyLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._held = 0
        self._by_client: dict[str, int] = {}
        self.refused = 0  # bodies refused since start (for tests and the curious)

    @property
    def held(self) -> int:
        return self._held

    def held_by(self, client: str) -> int:
        return self._by_client.get(client, 0)

    def hold(self, client: str) -> HeldBody:
        return HeldBody(self, client)

    def _take(self, client: str, size: int) -> None:
        limits = self.limits
        with self._lock:
            mine = self._by_client.get(client, 0)
            if mine + size > limits.per_client:
                self.refused += 1
                raise TooManyRequests(
                    f"this client's request bodies would hold {_mib(mine + size)} in context-guard, over its "
                    f"share of {_mib(limits.per_client)}; retry once its other requests are answered",
                    headers=self._retry(),
                )
            if self._held + size > limits.total:
                self.refused += 1
                raise Overloaded(
                    f"context-guard holds {_mib(self._held)} of request bodies, its limit is {_mib(limits.total)}; "
                    "retry shortly",
                    headers=self._retry(),
                )
            self._held += size
            self._by_client[client] = mine + size

    def _give_back(self, client: str, size: int) -> None:
        with self._lock:
            self._held -= size
            left = self._by_client.get(client, 0) - size
            if left > 0:
                self._by_client[client] = left
            else:
                self._by_client.pop(client, None)

    def _retry(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, math.ceil(self.limits.retry_after)))}


class HeldBody:
    """One request's bytes on the budget: `take(n)` as they come (or raise 429 / 503), `release()`
    when the request ends (again is harmless)."""

    __slots__ = ("_budget", "client", "size")

    def __init__(self, budget: BodyBudget, client: str) -> None:
        self._budget, self.client, self.size = budget, client, 0

    def take(self, size: int) -> None:
        if size > 0:
            self._budget._take(self.client, size)
            self.size += size

    def release(self) -> None:
        size, self.size = self.size, 0
        if size:
            self._budget._give_back(self.client, size)


def _mib(size: int) -> str:
    return f"{size / MIB:,.1f} MiB"


BODY_BUDGET = web.AppKey("body_budget", BodyBudget)
HELD_BODY = web.RequestKey("held_body", HeldBody)  # the request's account, released by the middleware when it ends


GZIP_WBITS = 16 + zlib.MAX_WBITS
ZLIB_WBITS = zlib.MAX_WBITS
RAW_DEFLATE_WBITS = -zlib.MAX_WBITS
ENCODINGS = ("gzip", "x-gzip", "deflate")  # the request codings `inflate_within` undoes
# The codings an upstream's answer is read through (`Decoder`); any other is read as it came.
_READ_WBITS = {"gzip": GZIP_WBITS, "deflate": ZLIB_WBITS}


class Oversized(ValueError):
    """The decoded data would pass the limit it was inflated under."""


class Undecodable(ValueError):
    """Corrupt, truncated, or followed by data that belongs to no stream. The message completes
    a sentence about the data (`is not valid gzip data (...)`)."""


def inflate_within(data: bytes, encoding: str, limit: int, charge: Callable[[int], None] | None = None) -> bytes:
    """`data` decoded from `encoding` (gzip, x-gzip or deflate), producing at most `limit` bytes:
    `Oversized` as soon as the output would pass it, `Undecodable` for corrupt or truncated data.
    `charge(n)` is called before each `n` bytes produced are kept (at most `CHUNK` at a time), so a
    memory budget can refuse them (by raising) before they are."""
    if encoding in ("gzip", "x-gzip"):
        return _inflate(data, GZIP_WBITS, limit, charge, members=True)
    # deflate is zlib-wrapped by the standard, but some clients send it raw: the wrapper's two-byte
    # header (method 8, checksum divisible by 31) tells them apart.
    wrapped = len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0
    return _inflate(data, ZLIB_WBITS if wrapped else RAW_DEFLATE_WBITS, limit, charge, members=False)


# Inflated output is produced, charged and checked this much at a time: a budget sees the body
# grow in steps of it, and a cancelled request stops within one.
CHUNK = 1024 * 1024


def _inflate(data: bytes, wbits: int, limit: int, charge: Callable[[int], None] | None, *, members: bool) -> bytes:
    out = bytearray()
    pending = data
    while pending:
        decoder = zlib.decompressobj(wbits)
        while not decoder.eof:
            checkpoint()
            try:
                chunk = decoder.decompress(pending, min(CHUNK, limit + 1 - len(out)))
            except zlib.error as exc:
                raise Undecodable(f"is not valid {_name(wbits)} data ({exc})") from None
            pending = decoder.unconsumed_tail
            if len(out) + len(chunk) > limit:
                raise Oversized(f"inflates to more than the limit of {limit:,} bytes")
            if charge is not None:
                charge(len(chunk))
            out += chunk
            if not chunk and not pending and not decoder.eof:
                raise Undecodable(f"is truncated {_name(wbits)} data")
        pending = decoder.unused_data
        if pending and not members:
            raise Undecodable(f"has data after its {_name(wbits)} stream")
    return bytes(out)


def _name(wbits: int) -> str:
    return "gzip" if wbits == GZIP_WBITS else "deflate"


class Decoder:
    """Undoes gzip or deflate for reading only, chunk by chunk; the bytes relayed stay as received."""

    def __init__(self, content_encoding: str | None) -> None:
        wbits = _READ_WBITS.get((content_encoding or "").strip().lower())
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


def decoded(body: bytes, content_encoding: str | None, limit: int) -> bytes:
    """A whole `body` without its gzip or deflate encoding, at most `limit` bytes of it, for
    reading (never for relaying); a body that does not decode comes back as it was."""
    return Decoder(content_encoding)(body, limit)


def bad_request(error: BodyError) -> BadRequest:
    """The 400 for a body error: its message, and the field it names as `param`."""
    return BadRequest(str(error), param=error.param)


class _BadBodyErrors:
    """The context manager `bad_body_errors()` returns: stateless, so one serves every request
    (a class, not `@contextmanager`: no generator made per request on the parse path)."""

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if isinstance(error, BodyError):
            raise bad_request(error) from None


_MAPPING = _BadBodyErrors()


def bad_body_errors() -> _BadBodyErrors:
    """Inside, a body error of any layer is raised as its `BadRequest`; other errors pass untouched."""
    return _MAPPING


def parse_chat(raw: bytes) -> dict[str, Any]:
    """A chat-completions body read as the guard reads it, a bad one its 400 (for the echo upstream and tools)."""
    with bad_body_errors():
        return read_chat_body(raw)


# After an answer to a request whose body was not read (401, 408, 413), aiohttp keeps reading and
# discarding the rest for this long, so the client sees the answer rather than a reset, then closes.
UNREAD_BODY_LINGER_SECONDS = 2.0


@dataclass(frozen=True)
class BodyPolicy:
    """`read_timeout`: seconds a client has to send its whole request body."""

    read_timeout: float = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.read_timeout, int | float) or not self.read_timeout > 0:
            raise ValueError(f"server.body_timeout_seconds must be a positive number, not {self.read_timeout!r}")


BODY_POLICY = web.AppKey("body_policy", BodyPolicy)


def content_encoding(header: str | None) -> str | None:
    """The one encoding to undo, None for none; 415 for an unknown or stacked encoding."""
    codings = [c.strip().lower() for c in (header or "").split(",")]
    codings = [c for c in codings if c and c != "identity"]
    if not codings:
        return None
    if len(codings) > 1:
        raise UnsupportedEncoding("stacked request Content-Encodings are not accepted; send one of: gzip, deflate")
    if codings[0] not in ENCODINGS:
        raise UnsupportedEncoding(f"request Content-Encoding {codings[0]!r} is not supported; use gzip or deflate")
    return codings[0]


async def read_body(request: web.Request, max_bytes: int, client: str | None = None) -> bytes:
    """The request's body, decoded, within `max_bytes`, the app's read deadline (`BODY_POLICY`) and
    the client's share of the bodies held (`BODY_BUDGET`; `client`: its key, when the caller has
    worked it out already); raises 408, 413, 415, 400 (corrupt compressed data), 429 or 503 (the
    memory budget)."""
    policy = request.app[BODY_POLICY]
    if request.content_length is not None and request.content_length > max_bytes:
        raise PayloadTooLarge(f"the request body is {request.content_length:,} bytes; the limit is {max_bytes:,}")
    encoding = content_encoding(request.headers.get("Content-Encoding"))
    held = request.get(HELD_BODY)
    if held is None:  # the middleware gives it back when the request ends, however it ends
        client = (
            client
            if client is not None
            else client_key(credential_digest(request.headers, request.query), request.remote)
        )
        held = request[HELD_BODY] = request.app[BODY_BUDGET].hold(client)
    try:
        if request.content.is_eof():  # all of it has arrived (most bodies): nothing to wait for, no timer to set
            raw = await _received(request, held, max_bytes)
        else:
            async with asyncio.timeout(policy.read_timeout):
                raw = await _received(request, held, max_bytes)
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {policy.read_timeout:g} s") from None
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge(f"the request body is over the limit of {max_bytes:,} bytes") from None
    if encoding is None or not raw:
        return raw
    # In the large-body threads, within the client's share of them: at most one per core inflates
    # at once, and the budget sees each MiB before it is kept.
    return await large_body_slots().run(held.client, inflate, raw, encoding, max_bytes, held.take)


async def _received(request: web.Request, held: HeldBody, max_bytes: int) -> bytes:
    """The body's bytes as sent, each taken from the budget before it is kept: an announced length
    at once (refused before a byte is read), a chunked body as its chunks come."""
    if request.content_length is not None:
        held.take(request.content_length)
        return await request.read()
    chunks, size = [], 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > max_bytes:
            raise PayloadTooLarge(f"the request body is over the limit of {max_bytes:,} bytes")
        held.take(len(chunk))
        chunks.append(chunk)
    return b"".join(chunks)


def inflate(data: bytes, encoding: str, limit: int, charge: Callable[[int], None] | None = None) -> bytes:
    """`data` decoded from `encoding` (gzip, x-gzip or deflate), producing at most `limit` bytes
    (each MiB given to `charge` first, which may refuse it by raising): PayloadTooLarge as soon as
    the output would pass it, BadRequest for corrupt or truncated data."""
    try:
        return inflate_within(data, encoding, limit, charge)
    except Oversized as exc:
        raise PayloadTooLarge(f"the request body {exc}") from None
    except Undecodable as exc:
        raise _Corrupt(f"the request body {exc}") from None


class _Corrupt(BadRequest):
    pass
