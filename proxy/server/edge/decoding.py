"""Undoing a body's gzip or deflate `Content-Encoding`: the proxy's one content decoder.

Three readers need it, each with its own bound on what inflation may produce (a small compressed
body can inflate a thousandfold, and a bound is the only defence against a bomb):
- a client's request body (`proxy.server.edge.body`) is inflated whole and strictly: corrupt,
  truncated or trailing data is an error, and so is output past the size limit (`inflate`);
- an upstream's answer is read as it is relayed, for its first event and its usage
  (`proxy.server.upstream.relay`, `proxy.server.upstream.usage`), and an upstream's error body for
  its message (`proxy.server.upstream.connection`): leniently, chunk by chunk, at most a given length
  per call, and what does not decode is read as it came (`Decoder`, `decoded`). The bytes
  relayed to the client are never the decoded ones.

gzip (several members too), `x-gzip` and deflate (zlib-wrapped, or raw as some clients send it)
are understood when inflating strictly; the lenient reader knows gzip and zlib-wrapped deflate.
Pure zlib, no I/O: the callers choose the thread it runs in (and stop it with
`proxy.core.cancellation`).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

from proxy.core.cancellation import checkpoint

GZIP_WBITS = 16 + zlib.MAX_WBITS
ZLIB_WBITS = zlib.MAX_WBITS
RAW_DEFLATE_WBITS = -zlib.MAX_WBITS
ENCODINGS = ("gzip", "x-gzip", "deflate")  # the request codings `inflate` undoes
# The codings an upstream's answer is read through (`Decoder`); any other is read as it came.
_READ_WBITS = {"gzip": GZIP_WBITS, "deflate": ZLIB_WBITS}


class Oversized(ValueError):
    """The decoded data would pass the limit it was inflated under."""


class Undecodable(ValueError):
    """Corrupt, truncated, or followed by data that belongs to no stream. The message completes
    a sentence about the data (`is not valid gzip data (...)`)."""


def inflate(data: bytes, encoding: str, limit: int, charge: Callable[[int], None] | None = None) -> bytes:
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
