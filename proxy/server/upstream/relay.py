"""Talking to upstreams: routing, headers, forwarding, streaming, and error mapping.

Every upstream comes from the config; a client can name a model, never a host, so the proxy is
never an open relay. aiohttp's errors are translated in one place, `upstream_errors()`:
refused or reset connections become `UpstreamUnavailable` (502), timeouts `UpstreamTimeout` (504).
Responses are relayed chunk by chunk as they arrive, compressed bytes and all.

HTTP hygiene, both ways: hop-by-hop headers, every header named in `Connection` or
`Proxy-Connection`, and (outgoing) any header carrying the proxy's own client key never cross.
The request body is always sent decoded (`proxy.server.body`), so `Content-Encoding` does not
cross either. Calls upstream take a slot of a bounded pool (`PoolPolicy`); a request that waits
longer than `server.connection_wait_seconds` for one gets 503 `overloaded` with `Retry-After`, which says "the proxy is
busy", not 504 "the upstream is slow". An upstream body that ends before its announced length
aborts the client's connection, so the client sees a broken response instead of waiting forever.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.apis.stream_errors import broken_stream_event
from proxy.config.settings import Settings
from proxy.config.upstreams import Route, UpstreamSettings
from proxy.errors import GuardError, ModelNotRouted, Overloaded, UpstreamTimeout, UpstreamUnavailable
from proxy.server import decoding
from proxy.server.credentials import names_a_client_key
from proxy.server.record import REPORT_PREFIX  # the guard's own headers never leave it
from proxy.server.upstream.sse import is_event_stream

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
        "proxy-connection",
    }
)
# The body sent upstream is always the decoded one (`proxy.server.body`).
REQUEST_ONLY_DROPPED = frozenset({"content-encoding"})
MAX_ERROR_BODY = 1024 * 1024
# What an error body is read as, inflated, at most: its message is near the start, and 1 MiB of
# compressed bytes could otherwise inflate to a gigabyte.
MAX_DECODED_ERROR_BODY = 4 * MAX_ERROR_BODY


@dataclass(frozen=True)
class Target:
    upstream: UpstreamSettings
    model: str | None  # the name to send upstream (renamed by the route, if it says so)


class Router:
    """The routes of one configuration. A model's target is worked out once (the routes' globs
    tried in order) and kept, for at most `MAX_ROUTED` model names (clients name what they like:
    past the bound the oldest kept goes, so names nobody sends again do not freeze the table);
    a reload builds a new gateway and with it a new router, so nothing kept outlives the routes
    it came from."""

    MAX_ROUTED = 4096

    def __init__(self, settings: Settings) -> None:
        self.upstreams = settings.upstreams
        self.routes: tuple[Route, ...] = settings.routes
        self._routed: dict[str, Target | None] = {}  # None: no route matches

    def route(self, model: str | None) -> Target:
        """The upstream for `model`: the first route whose name or glob matches it."""
        if model is None:
            return self.default()
        try:
            target = self._routed[model]
        except KeyError:
            target = self._first_match(model)
            routed = self._routed
            if len(routed) >= self.MAX_ROUTED:
                del routed[next(iter(routed))]
            routed[model] = target
        if target is None:
            raise ModelNotRouted(f"no upstream is configured for model {model!r}", param="model")
        return target

    def _first_match(self, model: str) -> Target | None:
        for route in self.routes:
            if route.matches(model):
                return Target(self.upstreams[route.upstream], route.rename or model)
        return None

    def default(self) -> Target:
        """For requests that name no model: the catch-all route's upstream, else the first route's."""
        route = next((r for r in self.routes if r.match == "*"), self.routes[0])
        return Target(self.upstreams[route.upstream], None)


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
    headers: CIMultiDict[str] = CIMultiDict()
    for name, value in client.items():
        lower = name.lower()
        if lower in dropped or lower.startswith(REPORT_PREFIX) or (keys and names_a_client_key(value, keys)):
            continue
        headers.add(name, value)
    for name, value in upstream.headers.items():
        headers[name] = value
    key_header = _KEY_HEADERS.get(upstream.kind)
    injected_key = upstream.api_key_env and not (upstream.token_command or upstream.token_file or upstream.auth)
    if authorization and key_header and injected_key and authorization.startswith("Bearer "):
        # Anthropic, Azure and Gemini take an API key in a header of their own, not as a bearer token.
        headers.popall(key_header, None)
        headers[key_header] = authorization.removeprefix("Bearer ")
    elif authorization:
        headers["Authorization"] = authorization
    if upstream.kind == "anthropic":
        headers.setdefault("anthropic-version", ANTHROPIC_VERSION)
    return headers


# Google's APIs take an API key (Vertex AI's express mode, the Gemini API) as `x-goog-api-key`, never as a bearer token.
_KEY_HEADERS = {"anthropic": "x-api-key", "azure": "api-key", "gemini": "x-goog-api-key", "vertex": "x-goog-api-key"}
ANTHROPIC_VERSION = "2023-06-01"  # sent only when the client named none


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
    held by one client (`proxy.server.slots.client_key`: its credential, else its address), so
    that one client holding slow streams cannot take them all: a quarter stays for the others."""

    def __init__(self, policy: PoolPolicy) -> None:
        self.policy = policy
        self.per_client = max(1, policy.size - policy.size // 4)
        self._slots = asyncio.Semaphore(policy.size)
        self._shares: dict[str, _Share] = {}  # clients with a call holding or waiting for a slot

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


@dataclass
class Relayed:
    response: web.StreamResponse
    broken: str | None = None  # why the upstream stream ended early, if it did
    client_gone: bool = False


async def relay(
    request: web.Request,
    upstream: UpstreamSettings,
    response: aiohttp.ClientResponse,
    extra_headers: Mapping[str, str],
    chunks: AsyncIterator[bytes] | None = None,
    broken_event: Callable[[str], bytes] | None = None,
) -> Relayed:
    """Stream `response` to the client as it arrives (or `chunks`, when given: its body, already
    begun or filtered; see `proxy.server.upstream.answers`). A client that goes away ends the relay
    (and, by leaving the upstream call, closes the upstream connection). An upstream that breaks
    mid-stream ends an event stream cleanly, with an SSE error event (`broken_event`'s, in the
    client's API's grammar; OpenAI's when not given) then EOF; any other body
    (or an event stream of announced length) is cut off by closing the client's connection, so
    that a half response can never pass for a whole one."""
    # The headers go out with the first bytes (one write, not two) unless this is an event stream
    # relayed from its very start: then they are sent at once, as the upstream sent its own.
    eager = chunks is None and is_event_stream(response)
    out = (web.StreamResponse if eager else _HeadersWithFirstBytes)(status=response.status, reason=response.reason)
    out.headers.update(response_headers(response.headers))
    out.headers.update(extra_headers)
    if response.content_length is not None:  # a whole body of known size keeps its length; streams stay chunked
        out.content_length = response.content_length
    await out.prepare(request)
    relayed = Relayed(out)
    try:
        async for chunk in response.content.iter_any() if chunks is None else chunks:
            await out.write(chunk)
    except ConnectionResetError:
        relayed.client_gone = True
        return relayed
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        relayed.broken = f"upstream {upstream.name!r} ended the stream early ({type(exc).__name__})"
        if not is_event_stream(response) or out.content_length is not None:
            abort(request)
            return relayed
        event = broken_event(relayed.broken) if broken_event else broken_stream_event("chat", relayed.broken)
        with contextlib.suppress(ConnectionResetError):
            await out.write(event)
    with contextlib.suppress(ConnectionResetError):
        await out.write_eof()
    return relayed


class _HeadersWithFirstBytes(web.StreamResponse):
    """A relayed response whose status line and headers are written together with its first body
    bytes, as aiohttp's own `web.Response` does (its `_send_headers_immediately`): on loopback
    each write costs a system call and the receiver's wake-up. A body that never comes still
    gets its headers, with the end of the response."""

    _send_headers_immediately = False


def abort(request: web.Request) -> None:
    """Close the client's connection now, mid-response: the client sees a truncated body."""
    request.protocol.force_close()
    if request.transport is not None:
        request.transport.close()
