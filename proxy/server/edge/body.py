"""Reading a request body: within a deadline, within the size limit, and inflated when compressed.

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
- every byte kept, as sent and as inflated, is taken from the process's budget of bodies held and
  the client's share of it first (`proxy.server.edge.body_budget`: 429 or 503 with `Retry-After`
  past them), and given back when the request ends;
- the decoded body is what is counted *and* forwarded (the outgoing headers drop
  `Content-Encoding`, and the length is the decoded length).

gzip (several members too), `x-gzip` and deflate (zlib-wrapped, or raw as some clients send it)
are understood (`proxy.server.edge.decoding` inflates them); `identity` is nothing to do. Other
encodings get 415; br and zstd would be added there when a decoder library is installed (none
is a dependency).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from proxy.errors import BadRequest, PayloadTooLarge, RequestTimeout, UnsupportedEncoding
from proxy.server.edge import decoding
from proxy.server.edge.body_budget import BODY_BUDGET, HELD_BODY, HeldBody
from proxy.server.edge.credentials import credential_digest
from proxy.server.edge.decoding import ENCODINGS
from proxy.server.threads.placement import large_body_slots
from proxy.server.threads.slots import client_key

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
        return decoding.inflate(data, encoding, limit, charge)
    except decoding.Oversized as exc:
        raise PayloadTooLarge(f"the request body {exc}") from None
    except decoding.Undecodable as exc:
        raise _Corrupt(f"the request body {exc}") from None


class _Corrupt(BadRequest):
    pass
