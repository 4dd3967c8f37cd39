"""An upstream's failures, read in one place.

aiohttp's errors are translated by `upstream_errors()`: refused or reset connections become
`UpstreamUnavailable` (502), timeouts `UpstreamTimeout` (504). An error body is read bounded, and
inflated bounded, for its message."""

from __future__ import annotations

import functools

import aiohttp

from proxy.config.upstreams import UpstreamSettings
from proxy.errors import GuardError, UpstreamTimeout, UpstreamUnavailable
from proxy.server.edge import decoding

MAX_ERROR_BODY = 1024 * 1024


# What an error body is read as, inflated, at most: its message is near the start, and 1 MiB of
# compressed bytes could otherwise inflate to a gigabyte.
MAX_DECODED_ERROR_BODY = 4 * MAX_ERROR_BODY


def upstream_failure(upstream: UpstreamSettings, exc: BaseException) -> GuardError | None:
    """aiohttp's failure `exc` as the proxy's own error; None for every other exception."""
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return UpstreamTimeout(f"upstream {upstream.name!r} did not answer in time")
    if isinstance(exc, aiohttp.ClientResponseError):
        return UpstreamUnavailable(f"upstream {upstream.name!r} sent a malformed response: {exc.message}")
    if isinstance(exc, aiohttp.ClientError | OSError):
        return UpstreamUnavailable(f"upstream {upstream.name!r} is unreachable ({type(exc).__name__})")
    return None


class upstream_errors:  # used as a function: `with upstream_errors(upstream):`
    """aiohttp's failures as the proxy's own errors; every other exception passes through.
    A class rather than a generator-based context manager: it wraps every upstream call."""

    __slots__ = ("upstream",)

    def __init__(self, upstream: UpstreamSettings) -> None:
        self.upstream = upstream

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, Exception):  # anything else goes on as it was (None: not swallowed)
            error = upstream_failure(self.upstream, exc)
            if error is not None:
                raise error from exc


@functools.lru_cache(maxsize=64)
def client_timeout(connect: float | None, read: float | None) -> aiohttp.ClientTimeout:
    """An upstream's deadlines (`connect_timeout`, `read_timeout`), built once per pair: frozen, shared."""
    return aiohttp.ClientTimeout(total=None, connect=connect, sock_read=read)


async def read_error_body(upstream: UpstreamSettings, response: aiohttp.ClientResponse) -> bytes:
    with upstream_errors(upstream):
        return await response.content.read(MAX_ERROR_BODY)


def decoded(body: bytes, content_encoding: str | None) -> bytes:
    """`body` without its gzip or deflate encoding, for reading an error, not for relaying it:
    clients (the openai SDK among them) ask for compressed responses, and the proxy relays bytes
    as they come. Anything it cannot decode comes back as it was; at most `MAX_DECODED_ERROR_BODY`
    bytes of it are inflated."""
    return decoding.decoded(body, content_encoding, MAX_DECODED_ERROR_BODY)
