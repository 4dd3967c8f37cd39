"""The upstream `ClientSession`, and one more try of a request that met a stale pooled connection.

A kept-alive connection the server closed fails the next request before a byte of response
(`ServerDisconnectedError`); aiohttp retries that only for idempotent methods.
`send_retrying_stale()` sends a POST once more on a fresh connection, of a session made as
`upstream_session()` makes the app's (no cookie jar shared between clients, nothing decompressed).
"""

from __future__ import annotations

import errno
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import hdrs
from aiohttp.http import SERVER_SOFTWARE
from yarl import URL


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
        request_class=UpstreamRequest,
    )


class UpstreamRequest(aiohttp.ClientRequest):
    """aiohttp's request, which adds its default headers (`Accept`, `User-Agent`) where the
    request has none, but never `Accept-Encoding`. The same as the session's
    `skip_auto_headers=("Accept-Encoding",)`, without what that costs every request: aiohttp then
    builds a header dict of the names to skip and a copy of the request's headers (7 us of a
    request's 20 us in `ClientRequest`). Names asked to be skipped in a call are still skipped."""

    def update_auto_headers(self, skip_auto_headers: Iterable[str] | None) -> None:
        if skip_auto_headers is not None:
            super().update_auto_headers((*skip_auto_headers, hdrs.ACCEPT_ENCODING))
            return
        headers = self.headers
        for name, value in self.DEFAULT_HEADERS.items():
            if name != hdrs.ACCEPT_ENCODING and name not in headers:
                headers[name] = value
        if hdrs.USER_AGENT not in headers:
            headers[hdrs.USER_AGENT] = SERVER_SOFTWARE


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
