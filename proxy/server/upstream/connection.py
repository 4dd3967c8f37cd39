"""The connection to an upstream: the headers that cross, the bounded pool of calls, the session and
its one retry of a stale connection, and the upstream's failures read in one place.

Headers: hop-by-hop headers, every header named in `Connection` or `Proxy-Connection`, and
(outgoing) any header carrying the proxy's own client key never cross. The request body is always
sent decoded (`proxy.server.edge.body`), so `Content-Encoding` does not cross either; the
upstream's own credential replaces the client's, in the header its provider names
(`proxy.providers`).

The pool: calls upstream take a slot of a bounded pool (`PoolPolicy`); a request that waits longer
than `server.connection_wait_seconds` for one gets 503 `overloaded` with `Retry-After`, which says
"the proxy is busy", not 504 "the upstream is slow".

The session: a kept-alive connection the server closed fails the next request before a byte of
response (`ServerDisconnectedError`); aiohttp retries that only for idempotent methods.
`send_retrying_stale()` sends a POST once more on a fresh connection, of a session made as
`upstream_session()` makes the app's (no cookie jar shared between clients, nothing decompressed).

Failures: aiohttp's errors are translated by `upstream_errors()`: refused or reset connections
become `UpstreamUnavailable` (502), timeouts `UpstreamTimeout` (504). An error body is read
bounded, and inflated bounded, for its message; an overflow error without numbers gets the guard's
count added to its message (`with_guard_count`).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import hdrs, web
from aiohttp.http import SERVER_SOFTWARE
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from proxy.apis.anthropic.context_edits import without_beta
from proxy.config.upstreams import UpstreamSettings
from proxy.core.learning.corrections import Overflow
from proxy.core.plan import Plan
from proxy.errors import GuardError, Overloaded, UpstreamTimeout, UpstreamUnavailable
from proxy.server.edge.body import decoded as decoded_within
from proxy.server.edge.credentials import CLIENT_CREDENTIAL_HEADERS, injects_credential, names_a_client_key
from proxy.server.observation.record import REPORT_PREFIX  # the guard's own headers never leave it

HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
     "transfer-encoding", "upgrade", "host", "content-length", "proxy-connection"}
)  # fmt: skip


# The body sent upstream is always the decoded one (`proxy.server.edge.body`).
REQUEST_ONLY_DROPPED = frozenset({"content-encoding"})


def connection_named(headers: Mapping[str, str]) -> frozenset[str]:
    """The header names listed in `Connection` and `Proxy-Connection`: hop-by-hop by declaration."""
    if isinstance(headers, CIMultiDictProxy | CIMultiDict):  # a request's or response's: looked up, not scanned
        values = [*headers.getall("connection", ()), *headers.getall("proxy-connection", ())]
    else:
        values = [value for name, value in headers.items() if name.lower() in ("connection", "proxy-connection")]
    if not values:
        return _NONE_NAMED
    return frozenset(token.strip().lower() for value in values for token in value.split(",") if token.strip())


_NONE_NAMED: frozenset[str] = frozenset()


_REQUEST_DROPPED = HOP_BY_HOP | REQUEST_ONLY_DROPPED | {"authorization"}  # the upstream's own credential goes


def request_headers(
    client: Mapping[str, str],
    upstream: UpstreamSettings,
    authorization: str | None,
    client_keys: Iterable[str] = (),
) -> CIMultiDict[str]:
    keys = tuple(client_keys)
    named = connection_named(client)
    dropped = _REQUEST_DROPPED | named if named else _REQUEST_DROPPED
    if injects_credential(upstream) and authorization is not None and authorization != client.get("Authorization"):
        dropped = dropped | CLIENT_CREDENTIAL_HEADERS  # the operator's: no key or project of the client's beside it
    headers: CIMultiDict[str] = CIMultiDict()
    for name, value in client.items():
        lower = name.lower()
        if lower in dropped or lower.startswith(REPORT_PREFIX) or (keys and names_a_client_key(value, keys)):
            continue
        headers.add(name, value)
    for name, value in upstream.headers.items():
        headers[name] = value
    provider = upstream.provider
    key_header = provider.key_header
    injected_key = upstream.api_key_env and not (upstream.token_command or upstream.token_file or upstream.auth)
    if authorization and key_header and injected_key and authorization.startswith("Bearer "):
        # Anthropic, Azure and Google take an API key in a header of their own, not as a bearer token.
        headers.popall(key_header, None)
        headers[key_header] = authorization.removeprefix("Bearer ")
    elif authorization:
        headers["Authorization"] = authorization
    for name, value in provider.default_headers.items():  # Anthropic's `anthropic-version`, when the client named none
        headers.setdefault(name, value)
    if upstream.edits_by_guard and "anthropic-beta" in headers:  # the guard applies the edits, not the upstream
        betas = without_beta(",".join(headers.popall("anthropic-beta")))
        if betas:
            headers["anthropic-beta"] = betas
    return headers


def response_headers(upstream: Mapping[str, str]) -> CIMultiDict[str]:
    """The upstream's headers less hop-by-hop ones. Its own request id (OpenAI's, for support
    tickets) is kept as `x-upstream-request-id`: `x-request-id` is the proxy's."""
    named = connection_named(upstream)
    dropped = HOP_BY_HOP | named if named else HOP_BY_HOP
    headers: CIMultiDict[str] = CIMultiDict()
    for name, value in upstream.items():
        lower = name.lower()
        if lower == "x-request-id":
            headers["x-upstream-request-id"] = value
        elif lower not in dropped:
            headers.add(name, value)
    return headers


@dataclass(frozen=True)
class PoolPolicy:
    """`size`: upstream calls in flight at once (streams hold theirs until they end);
    `wait`: seconds a request may wait for a free one before it gets 503."""

    size: int = 1024
    wait: float = 5.0

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 1:
            raise ValueError(f"server.upstream_connections must be a whole number of at least 1, not {self.size!r}")
        if not isinstance(self.wait, int | float) or self.wait < 0:
            raise ValueError(f"server.connection_wait_seconds must be 0 or more, not {self.wait!r}")


@dataclass
class _Share:
    """One client's part of the pool: its own slots, and how many of its calls hold or wait for one."""

    slots: asyncio.Semaphore
    users: int = 0


class UpstreamPool:
    """The slots of `PoolPolicy`: one per upstream call in flight, at most `per_client` of them
    held by one client (`proxy.server.threads.placement.client_key`: its credential, else its address), so
    that one client holding slow streams cannot take them all: a quarter stays for the others."""

    def __init__(self, policy: PoolPolicy) -> None:
        self.policy = policy
        self.per_client = max(1, policy.size - policy.size // 4)
        self._slots = asyncio.Semaphore(policy.size)
        self._shares: dict[str, _Share] = {}  # clients with a call holding or waiting for a slot
        # When each upstream last answered a call through the pool (monotonic time, any status):
        # `/readyz` reads it beside its own probes (`proxy.server.observation.health.Reachability`).
        self.answered: dict[str, float] = {}

    async def acquire(self, client: str = "") -> None:
        """Take a slot for `client`: at once when one is free and the client is within its share,
        else within the deadline (503 `overloaded` after it). Every slot taken is given back with
        `release(client)`."""
        share = self._shares.get(client)
        if share is None:
            share = self._shares[client] = _Share(asyncio.Semaphore(self.per_client))
        share.users += 1
        try:
            if not share.slots.locked() and not self._slots.locked():  # at once: no deadline timer
                await share.slots.acquire()
                await self._slots.acquire()
                return
            async with asyncio.timeout(self.policy.wait):
                await share.slots.acquire()
                try:
                    await self._slots.acquire()
                except BaseException:
                    share.slots.release()
                    raise
        except BaseException as exc:
            self._left(client, share)
            if isinstance(exc, TimeoutError):
                limit = f"{self.policy.size} upstream calls in flight ({self.per_client} for one client)"
                raise Overloaded(
                    f"context-guard is at its limit of {limit}; retry shortly",
                    headers={"Retry-After": str(max(1, math.ceil(self.policy.wait)))},
                ) from None
            raise

    def release(self, client: str = "") -> None:
        self._slots.release()
        share = self._shares[client]
        share.slots.release()
        self._left(client, share)

    def _left(self, client: str, share: _Share) -> None:
        share.users -= 1
        if share.users == 0:
            del self._shares[client]


UPSTREAM_POOL = web.AppKey("upstream_pool", UpstreamPool)


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
    return decoded_within(body, content_encoding, MAX_DECODED_ERROR_BODY)


def overflow_told(error_body: bytes, overflow: Overflow | None, plan: Plan | None) -> bytes | None:
    """An overflow error the provider gave without its count (OpenAI Responses' "Your input exceeds
    the context window of this model"), with the guard's own count of `plan` said after its
    message: the body as JSON again, every other field kept; None when there is nothing to add
    (another error, a count given, no plan, no message to add to)."""
    if overflow is None or overflow.prompt_tokens is not None or plan is None:
        return None
    result = plan.result
    tokens, budget, window = result.tokens_after, result.budget.input_budget, result.budget.context_window
    try:
        data = json.loads(error_body)
    except ValueError:
        return None
    error = data.get("error") if isinstance(data, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    if not isinstance(error, dict) or not isinstance(message, str):
        return None
    said = f" (context-guard counted {tokens:,} input tokens; its input budget is {budget:,}"
    said += f" of a {window:,}-token window)"
    return json.dumps({**data, "error": {**error, "message": message + said}}).encode()


def json_message(body: bytes) -> str:
    """The message of an OpenAI-shaped error body, for the guard's own error saying what came."""
    try:
        error = json.loads(body).get("error") or {}
    except (ValueError, AttributeError):
        return "an answer the guard cannot read"
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else "an answer the guard cannot read"
