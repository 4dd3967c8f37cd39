"""Reading a request body: within a deadline, within the size limit, and inflated when compressed.

The app turns off aiohttp's own request decompression (`auto_decompress=False`), because aiohttp
inflates on the event loop, as bytes arrive, before the handler (or the client-key check) has
run: a 1 MB gzip bomb that inflates to 1 GiB stalled every request, even when its answer was
401. Here, instead:

- the client-key middleware has already run: nothing is inflated for an unauthorised caller;
- the compressed bytes are read under `server.max_body_bytes` and a deadline
  (`server.body_timeout_seconds`): a client that sends half a body and waits gets 408, not a held socket;
- inflation runs in a worker thread and stops one byte past `max_body_bytes` (413): the cap
  bounds the work done and the memory held, not just the answer;
- the decoded body is what is counted *and* forwarded (the outgoing headers drop
  `Content-Encoding`, and the length is the decoded length).

gzip (several members too), `x-gzip` and deflate (zlib-wrapped, or raw as some clients send it)
are understood (`proxy.server.edge.decoding` inflates them); `identity` is nothing to do. Other
encodings get 415; br and zstd would be added there when a decoder library is installed (none
is a dependency).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiohttp import web

from proxy.errors import BadRequest, PayloadTooLarge, RequestTimeout, UnsupportedEncoding
from proxy.server.edge import decoding
from proxy.server.edge.decoding import ENCODINGS

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


async def read_body(request: web.Request, max_bytes: int) -> bytes:
    """The request's body, decoded, within `max_bytes` and the app's read deadline (`BODY_POLICY`);
    raises 408, 413, 415 or 400 (corrupt compressed data)."""
    policy = request.app[BODY_POLICY]
    if request.content_length is not None and request.content_length > max_bytes:
        raise PayloadTooLarge(f"the request body is {request.content_length:,} bytes; the limit is {max_bytes:,}")
    encoding = content_encoding(request.headers.get("Content-Encoding"))
    try:
        if request.content.is_eof():  # all of it has arrived (most bodies): nothing to wait for, no timer to set
            raw = await request.read()
        else:
            async with asyncio.timeout(policy.read_timeout):
                raw = await request.read()
    except TimeoutError:
        raise RequestTimeout(f"the request body did not arrive within {policy.read_timeout:g} s") from None
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge(f"the request body is over the limit of {max_bytes:,} bytes") from None
    if encoding is None or not raw:
        return raw
    return await asyncio.to_thread(inflate, raw, encoding, max_bytes)


def inflate(data: bytes, encoding: str, limit: int) -> bytes:
    """`data` decoded from `encoding` (gzip, x-gzip or deflate), producing at most `limit` bytes:
    PayloadTooLarge as soon as the output would pass it, BadRequest for corrupt or truncated data."""
    try:
        return decoding.inflate(data, encoding, limit)
    except decoding.Oversized as exc:
        raise PayloadTooLarge(f"the request body {exc}") from None
    except decoding.Undecodable as exc:
        raise _Corrupt(f"the request body {exc}") from None


class _Corrupt(BadRequest):
    pass
