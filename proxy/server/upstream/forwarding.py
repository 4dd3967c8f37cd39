"""Talking to an upstream for one request: the bytes to send, the call with its credentials and
timing, relaying the answer, and the paths forwarded untouched (pass-through)."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from proxy.apis.endpoints import MAX_NAME_CHARS
from proxy.apis.gemini.google_paths import GooglePath, google_path, passes
from proxy.config.upstreams import UpstreamSettings
from proxy.errors import BadRequest, GuardError, HTTPRefusal, ModelNotRouted, PathNotFound, UpstreamUnavailable
from proxy.providers.provider import OutgoingCall
from proxy.server.backends.models import Target
from proxy.server.backends.profiles import forwardable_request_id
from proxy.server.edge.body import read_body
from proxy.server.edge.credentials import (
    credential_digest,
    injects_credential,
    outside_project,
    without_client_keys,
    without_parameter,
)
from proxy.server.edge.paths import (
    PATH_ROUTE,
    CanonicalPath,
    canonical_path,
    counted_when_sent,
    host_root_url,
    upstream_url,
)
from proxy.server.request.flow import FLOW, Flow
from proxy.server.request.gateway import Gateway
from proxy.server.request.held import learned
from proxy.server.threads.placement import INLINE_BYTES, client_key, client_scope, performed
from proxy.server.upstream.connection import (
    UPSTREAM_POOL,
    client_timeout,
    decoded,
    json_message,
    overflow_told,
    read_error_body,
    request_headers,
    response_headers,
    send_retrying_stale,
    upstream_errors,
    upstream_failure,
)
from proxy.server.upstream.relay import overflow_probe, relay
from proxy.server.upstream.usage import reported_from_body
from proxy.wire.codec import check_density, dumps
from proxy.wire.top_level_model import top_level_model

# An answer the exchange did not accept: the upstream's response, its error body as it came and
# decoded, and the headers the guard adds to whatever it answers.
Failed = tuple[aiohttp.ClientResponse, bytes, bytes, dict[str, str]]


def outgoing(target: Target, model: str, body: Mapping[str, Any], raw: bytes, changed: Any) -> bytes:
    """The bytes to send upstream: `raw` (decoded, as received) when nothing changes; otherwise the
    body serialised, with the model renamed when the route says so and the body names one (an
    Azure deployment path carries its model in the path, not the body)."""
    body = changed if changed is not None else body
    renamed = target.model is not None and target.model != model and "model" in body
    if changed is None and not renamed:
        return raw
    return dumps({**body, "model": target.model} if renamed else body)


class UpstreamCall:
    """One call upstream, as `async with upstream_call(...) as response`: credentials, URL and
    headers resolved, a slot of the pool taken, the request sent (once more on a fresh connection
    if the pooled one had gone stale), aiohttp's failures mapped to the proxy's own errors (those
    of the body of the `with` too) and counted, and its time recorded. Written out as one class
    rather than nested generator-based context managers: this runs for every request."""

    __slots__ = ("_client", "_flow", "_payload", "_pool", "_sent", "_started", "_upstream")

    def __init__(self, flow: Flow, payload: bytes) -> None:
        self._flow, self._upstream, self._payload = flow, flow.target.upstream, payload

    async def __aenter__(self) -> aiohttp.ClientResponse:
        flow, upstream = self._flow, self._upstream
        request, gw = flow.request, flow.gw
        keys = gw.settings.server.client_keys
        auth = await gw.auths[upstream.name].header(request.headers.get("Authorization"), bool(keys))
        query = without_client_keys(request.rel_url.raw_query_string, keys)  # as received, less the proxy's keys
        if query and injects_credential(upstream):  # a client's `?key=` never travels beside the operator's credential
            query = without_parameter(query, "key")
        route = request[PATH_ROUTE]
        endpoint = route.endpoint
        if endpoint is not None and endpoint.sent_path is not None:  # the shape writes its own path
            tail = endpoint.sent_path(flow.target.model) + (f"?{query}" if query else "")
            url = URL(upstream.base_url + tail, encoded=True)
        elif endpoint.at_host_root if endpoint is not None else native_google(upstream, request):
            # Google's paths carry their own version and project: at the host's root, as written.
            segments = route.segments
            if endpoint is not None:
                segments = endpoint.upstream_segments(segments, flow.target.model)
            url = host_root_url(upstream.base_url, segments, query)
        else:
            url = upstream_url(upstream.base_url, route.path, query)
        if upstream.provider.google_native:  # Google's: the operator's credential stays in its project
            why = outside_project(upstream, _segments(url), gw.auths[upstream.name].project)
            if why is not None:
                raise HTTPRefusal(f"context-guard does not send this request: {why}", 403, code="project_refused")
        headers = request_headers(request.headers, upstream, auth, keys)
        if "x-request-id" in headers:  # the id the log and the answer carry, never one the proxy refused
            headers["x-request-id"] = flow.request_id
            if not forwardable_request_id(gw.backends.profile_of(upstream.name), flow.request_id):
                del headers["x-request-id"]  # llama-cpp-python refuses any id that is not a UUID
        if upstream.provider.signs:  # signed once the body and headers are final (AWS SigV4)
            call = OutgoingCall(request.method, str(url), headers, self._payload)
            call = await gw.auths[upstream.name].finished(call)
            url, headers = URL(call.url, encoded=True), CIMultiDict(call.headers)
        assert gw.session is not None, "the app's upstream session is opened at startup"
        self._started = time.perf_counter()
        self._pool = pool = request.app[UPSTREAM_POOL]
        self._client = client = flow.client or client_key(
            credential_digest(request.headers, request.query), request.remote
        )
        try:
            await pool.acquire(client)
            try:
                with upstream_errors(upstream):
                    self._sent = await send_retrying_stale(
                        gw.session,
                        request.method,
                        url,
                        headers=headers,
                        data=self._payload or None,
                        timeout=client_timeout(upstream.connect_timeout, upstream.read_timeout),
                        allow_redirects=False,
                        auto_decompress=False,
                    )
            except BaseException:
                pool.release(client)
                raise
        except BaseException as exc:
            self._ended(exc)
            raise
        response = self._sent.response
        flow.upstream_status = response.status
        self._pool.answered[upstream.name] = time.monotonic()  # it answered: reachable, for `/readyz`
        return response

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        try:
            try:
                with upstream_errors(self._upstream):  # closing can fail as reading can
                    await self._sent.close()
            finally:
                self._pool.release(self._client)
            error = upstream_failure(self._upstream, exc) if exc is not None else None
        except BaseException as failed:
            self._ended(failed)
            raise
        if error is not None:
            self._ended(error)
            raise error from exc
        self._ended(exc)

    def _ended(self, exc: BaseException | None) -> None:
        """The call's time, and a failure of the proxy's own kind counted for its upstream."""
        self._flow.upstream_ms += (time.perf_counter() - self._started) * 1000
        if isinstance(exc, GuardError):  # the upstream's failures, as upstream_failure() mapped them
            self._flow.gw.metrics.upstream_errors.labels(self._upstream.name, type(exc).__name__).inc()


def _segments(url: URL) -> tuple[str, ...]:
    return tuple(segment for segment in url.path.split("/") if segment)


def upstream_call(flow: Flow, payload: bytes) -> UpstreamCall:
    """The call `UpstreamCall` describes, for `async with`."""
    return UpstreamCall(flow, payload)


async def relay_answer(
    flow: Flow, response: aiohttp.ClientResponse, extra: dict[str, str], chunks: AsyncIterator[bytes] | None = None
) -> web.StreamResponse:
    # A broken stream ends with an error event in the grammar of the client's API.
    relayed = await relay(flow, response, extra, chunks)
    if relayed.broken:
        flow.stream_broken = relayed.broken
        flow.gw.metrics.upstream_errors.labels(flow.target.upstream.name, "stream_broken").inc()
    if relayed.client_gone:
        flow.client_disconnected = True
    return relayed.response


def buffered(response: aiohttp.ClientResponse, body: bytes, extra: dict[str, str]) -> web.Response:
    out = web.Response(status=response.status, reason=response.reason, body=body)
    out.headers.update(response_headers(response.headers))
    out.headers.update(extra)
    return out


def error_relayed(flow: Flow, failed: Failed) -> web.Response:
    """The upstream's own error, as it came (an overflow the provider gave without its count said
    with the guard's); a 200 with no answer in it is the guard's 502."""
    response, raw_error, error_body, extra = failed
    if response.status < 400:  # an empty or error stream the guard cannot fix
        raise UpstreamUnavailable(f"upstream {flow.target.upstream.name!r}: {json_message(error_body)}")
    exchange = flow.exchange
    told = overflow_told(error_body, exchange.overflow, exchange.plan) if exchange is not None else None
    if told is None:
        return buffered(response, raw_error, extra)
    answer = buffered(response, told, extra)
    answer.headers.popall("Content-Encoding", None)  # the body as inflated: its encoding header no longer applies
    return answer


async def probe_overflow(flow: Flow, sent: Mapping[str, Any]) -> tuple[int, bytes]:
    """A server that answers an over-window stream with an empty 200 is asked the same prompt, not
    streamed, for one token: its error then says the window and its count."""
    async with upstream_call(flow, dumps(overflow_probe(sent))) as response:
        body = await read_error_body(flow.target.upstream, response)
        if response.status < 400:
            return 502, b'{"error": {"message": "the upstream answered a stream with an empty body"}}'
        return response.status, decoded(body, response.headers.get("Content-Encoding"))


async def passthrough(request: web.Request) -> web.StreamResponse:
    """Any other path the passthrough policy allows: forwarded untouched (method, query, headers,
    body), routed by the body's `model` when it names one (Google's resource names, `models/x`,
    read as the model `x`), else a Google path to the first Google upstream the routes name, and
    anything else to the default upstream. To a Google upstream only Google's allow-list passes
    (`proxy.apis.gemini.google_paths`), under the path as written; to any other, nothing that
    lands on a path that generates."""
    flow = request[FLOW]
    gw = flow.gw
    flow.kind = "passthrough"
    digest = credential_digest(request.headers, request.query)  # who the client is: its shares and its scope
    client = flow.client = client_key(digest, request.remote)
    raw = await read_body(request, gw.settings.server.max_body_bytes, client)
    path = request[PATH_ROUTE].path
    google = google_path(path.segments)
    model = await _sniffed_model(request, gw, raw, client)
    if model and google is not None:
        model = model.rpartition("/")[2]  # `models/gemini-2.5-flash`, `projects/.../models/gemini-2.5-flash`
    target = _passthrough_target(gw, model, google, request)
    flow.target, flow.model = target, model
    upstream = target.upstream
    if native_google(upstream, request):
        if google is None or not passes(google, request.method):
            raise PathNotFound(
                f"context-guard does not forward {path} to upstream {upstream.name!r}: of Google's APIs it passes "
                "only cachedContents, files, model listings and stored interactions uncounted"
            )
    elif google is not None and google.google_only:
        raise PathNotFound(f"context-guard does not forward {path}: upstream {upstream.name!r} is not Google's")
    elif not upstream.provider.forwards_uncounted:  # signed with the guard's credentials: a model run uncounted
        raise PathNotFound(f"context-guard forwards only the counted paths to upstream {upstream.name!r}")
    else:
        _refuse_counted_or_generating(upstream.base_url, path, gw)
    async with upstream_call(flow, raw) as response:
        extra = {"x-request-id": flow.request_id}
        if google is not None and request.method == "POST" and google.resource[-1:] == ("cachedContents",):
            flow.scope = client_scope(request, digest)
            return await _cache_made(flow, response, extra)
        return await relay_answer(flow, response, extra)


# A cache's create answer is a few hundred bytes; past this it is relayed unread.
_CACHE_ANSWER_MOST = 64 * 1024


async def _cache_made(flow: Flow, response: aiohttp.ClientResponse, extra: dict[str, str]) -> web.StreamResponse:
    """A cache's create answer (its name, `usageMetadata.totalTokenCount`, `expireTime`: a small
    object, never its contents) relayed whole, and its size kept in the ledger for this client,
    so the first request naming it is counted without asking. Anything else is relayed as it came."""
    length = response.content_length
    if response.status != 200 or length is None or length > _CACHE_ANSWER_MOST:
        return await relay_answer(flow, response, extra)
    body = await response.read()
    await learned(flow, reported_from_body(body, response.headers.get("Content-Encoding")))
    return buffered(response, body, extra)


def _passthrough_target(gw: Gateway, model: str | None, google: GooglePath | None, request: web.Request) -> Target:
    """The model's route; for a Google path that names no model (or one no Google upstream
    serves), the first Google upstream a route names (Vertex AI's for a path naming a project);
    else the default route's."""
    routed = None
    if model:
        with contextlib.suppress(ModelNotRouted):
            routed = gw.router.route(model)
    asks_google = _asks_google(google, request)
    if routed is not None and (routed.upstream.provider.google_native or not asks_google):
        return routed
    if asks_google:  # the Google upstream its provider ranks first for the path (Vertex AI's for a project's)
        names_project = google is not None and google.project is not None
        ranked = []
        for order, route in enumerate(gw.router.routes):
            upstream = gw.settings.upstreams[route.upstream]
            rank = upstream.provider.google_preference(names_project)
            if rank is not None:
                ranked.append((rank, order, upstream))
        if ranked:
            return Target(min(ranked, key=lambda found: found[:2])[2], None)
    return routed or gw.router.default()


def native_google(upstream: UpstreamSettings, request: web.Request) -> bool:
    """Whether a forwarded request goes to Google's native API (its allow-list, at the host's root,
    under the path as written): always to a Gemini upstream, and to a Vertex AI upstream for a
    path of Google's own; an OpenAI-shaped path (`/v1/embeddings`) goes to Vertex AI's
    OpenAI-compatible endpoint under the base URL, as to any OpenAI upstream."""
    return upstream.provider.native_path(_asks_google(google_path(request[PATH_ROUTE].segments), request))


def _asks_google(google: GooglePath | None, request: web.Request) -> bool:
    """A path of Google's own, or one OpenAI has too (`/v1/models`) sent the way Google's clients send it."""
    return google is not None and (
        google.google_only or any(name in request.headers for name in _GOOGLE_SIGNS) or "key" in request.query
    )


# Headers only Google's clients send (google-genai's key header and its client id).
_GOOGLE_SIGNS = ("x-goog-api-key", "x-goog-api-client")


def _refuse_counted_or_generating(base_url: str, path: CanonicalPath, gw: Gateway) -> None:
    """Refuse a forwarded path that an upstream's base URL would land on a counted endpoint, or on
    one that generates uncounted: with a base at the host's root, `/v1/v1/projects/.../endpoints/
    openapi/chat/completions` would reach Vertex AI's OpenAI-compatible endpoint."""
    counted = counted_when_sent(base_url, path, gw.apis.api_for)
    if counted is not None:
        raise PathNotFound(
            f"context-guard does not forward {path}: it would be received as {counted}, which the guard "
            "counts; send it to that API's own path"
        )
    try:
        sent = canonical_path(upstream_url(base_url, path).raw_path).segments
    except ValueError:
        return
    if gw.apis.generates(sent):
        raise PathNotFound(f"context-guard does not forward {path}: it would reach an endpoint that generates")


async def _sniffed_model(request: web.Request, gw: Gateway, raw: bytes, client: str) -> str | None:
    """The body's `model`, read where a body of its size is read (`proxy.server.threads.placement`): on the
    loop up to `INLINE_BYTES`, else in the client's share of the threads (3.9 MB of `{}` parsed on
    the loop held it 324-344 ms)."""
    if not raw or "json" not in request.content_type or len(raw) > _SNIFF_BYTES:
        return None
    if len(raw) <= INLINE_BYTES:
        return _sniff_model(raw)
    large = len(raw) > gw.settings.server.offload_bytes
    return await performed(large, _sniff_model, raw, size=len(raw), client=client)


# A pass-through body larger than this is forwarded to the default upstream without reading its model.
_SNIFF_BYTES = 4 * 1024 * 1024


def _sniff_model(raw: bytes) -> str | None:
    """The body's top-level `model`; above 64 KiB, read without building the body's values
    (parsed whole in a thread, orjson held the GIL, and the loop with it, 59-127 ms over four
    3.9 MB bodies of small objects)."""
    try:
        check_density(raw)  # a dense body is not read for a name: it goes to the default upstream
    except ValueError:
        return None
    model = top_level_model(raw)
    if model is not None and len(model) > MAX_NAME_CHARS:  # it would key the route, the log and the page
        raise BadRequest(f"'model' must be at most {MAX_NAME_CHARS} characters, not {len(model):,}", param="model")
    return model or None
