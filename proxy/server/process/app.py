"""`create_app(settings) -> web.Application`: middlewares, the one dispatching route, the
upstream session, and the drain state (`Drain`: the requests in flight, and `Connection: close` on
every answer once the process is stopping, so clients and load balancers take their next request
elsewhere; `proxy.server.process.lifecycle` drives the steps).

One middleware, `records`, does in order what every request needs before its handler:
- it counts the request in flight until it ends, for a graceful drain (`Drain`);
- it opens the request's `Flow`, which is its record (with a request id it can trust), turns every failure
  into an error in the API's own shape (no traceback ever reaches a client), and when the
  request ends, however it ends, writes its one log line and its metrics;
- `canonical_route` reads the request's one canonical path (`proxy.server.edge.paths`), which alone
  decides what the request is: counted (by an API adapter), answered here (one of
  `proxy.server.edge.local_paths.LOCAL_PATHS`), or forwarded;
- `client_keys` checks the proxy's own client keys, when configured, before any body is read.
Those are steps of one middleware, not four: each layer is a coroutine more on every request.
One catch-all route then dispatches on the canonical path.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web

from proxy.apis.registry import AdapterRegistry
from proxy.config.settings import Settings
from proxy.config.upstreams import UpstreamSettings
from proxy.core.learning.calibration import CalibrationTable
from proxy.errors import GuardError, HTTPRefusal, PayloadTooLarge, Unauthorized
from proxy.logging import get_logger, log_request_line
from proxy.server.backends.catalogue import Backends
from proxy.server.backends.models import Models, Router
from proxy.server.backends.profiles import Discovery
from proxy.server.edge.body import (
    BODY_BUDGET,
    BODY_POLICY,
    HELD_BODY,
    UNREAD_BODY_LINGER_SECONDS,
    BodyBudget,
    BodyLimits,
    BodyPolicy,
)
from proxy.server.edge.credentials import UpstreamAuth, holds_client_key
from proxy.server.edge.local_paths import LOCAL_PATHS, is_probe, local_name, open_without_client_key
from proxy.server.edge.paths import (
    PASSTHROUGH,
    PATH_ROUTE,
    InvalidPath,
    PassthroughPolicy,
    PathRoute,
    canonical_path,
    error_body,
    route_for,
)
from proxy.server.observation.health import Health, Reachability, install_health
from proxy.server.observation.metrics import Metrics
from proxy.server.observation.recent import RECENT, RecentDecisions, install_page
from proxy.server.observation.record import RequestRecord, log_event
from proxy.server.request.flow import FLOW, Flow, request_id_of
from proxy.server.request.gateway import GATEWAY, Gateway
from proxy.server.request.perform import guarded
from proxy.server.request.summariser import open_summariser
from proxy.server.upstream.connection import UPSTREAM_POOL, PoolPolicy, UpstreamPool, upstream_session
from proxy.server.upstream.forwarding import passthrough
from proxy.state import open_store
from proxy.wire.codec import JsonLimits
from proxy.wire.readers import BodyReaders

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ROUTES_KEPT = 256  # distinct paths and methods whose routes a gateway keeps
CLIENT_CLOSED = 499  # nginx's code for a client that went away before its answer


class Drain:
    """Requests in flight, and what happened to them while the process was stopping."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.draining = False
        self.served_while_draining = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def started(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def finished(self) -> None:
        self.in_flight -= 1
        if self.draining:
            self.served_while_draining += 1
        if self.in_flight == 0:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """True when nothing is in flight any more; False if `timeout` ran out first."""
        if self._idle.is_set():
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True


DRAIN = web.AppKey("drain", Drain)


async def _close_when_draining(request: web.Request, response: web.StreamResponse) -> None:
    # Before the headers go out, so clients and load balancers read `Connection: close` and open
    # their next connection elsewhere instead of reusing this one.
    # aiohttp has already chosen its headers when this hook runs, hence the header set here too.
    if request.app[DRAIN].draining:
        response.force_close()
        response.headers["Connection"] = "close"


def install_drain(app: web.Application) -> None:
    """The drain state. The app's middleware calls `Drain.started()` before anything else a
    request does and `Drain.finished()` after everything (its log line included)."""
    app[DRAIN] = Drain()
    app.on_response_prepare.append(_close_when_draining)


def build_gateway(settings: Settings, guard: Models | None = None, previous: Gateway | None = None) -> Gateway:
    """Everything the handlers share, from `settings`. On a reload (`previous`), the metrics (their
    counters go on), the upstream session and the learned state (unless `state.*` changed) carry over;
    the rest is built anew."""
    guard = guard or Models(settings)
    log = previous.log if previous is not None else get_logger()
    for missing in guard.missing_vocabularies:  # counted with the family's bound, never refused
        log.warning("vocabulary_missing", **missing)
    keep_store = previous is not None and previous.settings.state == settings.state
    store = previous.store if previous is not None and keep_store else open_store(settings.state, log)
    if previous is not None:
        metrics = previous.metrics
        metrics.model_label, metrics.state_status = guard.model_label, store.status
    else:
        metrics = Metrics(guard.model_label, store.status)
    apis = AdapterRegistry(settings.apis.completions.options)
    gateway = Gateway(
        settings=settings,
        models=guard,
        router=Router(settings),
        auths={name: UpstreamAuth(upstream) for name, upstream in settings.upstreams.items()},
        metrics=metrics,
        log=log,
        apis=apis,
        readers=BodyReaders(
            apis.adapters, JsonLimits(max_depth=settings.server.max_json_depth), settings.server.prefix_memory_bytes
        ),
        store=store,
        backends=Backends(
            options={name: upstream.backend_options for name, upstream in settings.upstreams.items()},
            cache=guard.cache,
            calibration=previous.backends.calibration if previous is not None else CalibrationTable(
                settings.calibration.policy
            ),
            # What the servers said about themselves at start holds until a restart.
            discoveries=dict(previous.backends.discoveries) if previous is not None else {},
        ),
    )
    if previous is not None and previous.session is not None:
        gateway.session = previous.session
        gateway.summariser = open_summariser(settings, previous.session)
    return gateway


def create_app(settings: Settings, guard: Models | None = None) -> web.Application:
    gateway = build_gateway(settings, guard)
    server = settings.server
    # aiohttp enforces the body limit itself as it reads (413), so a huge body is never buffered whole.
    # aiohttp's own request decompression runs on the event loop before any check: off (see body.py).
    app = web.Application(
        client_max_size=server.max_body_bytes,
        middlewares=[records],
        handler_args={"auto_decompress": False, "lingering_time": UNREAD_BODY_LINGER_SECONDS},
    )
    app[GATEWAY] = gateway
    app[PASSTHROUGH] = PassthroughPolicy.parse(server.passthrough)
    app[BODY_POLICY] = BodyPolicy(server.body_timeout_seconds)
    app[BODY_BUDGET] = BodyBudget(BodyLimits(*server.body_memory))
    pool = app[UPSTREAM_POOL] = UpstreamPool(PoolPolicy(server.upstream_connections, server.connection_wait_seconds))
    install_drain(app)
    app.cleanup_ctx.append(_upstream_session)
    upstreams = {name: upstream.base_url for name, upstream in settings.upstreams.items()}
    reachability = Reachability(upstreams, settings.readiness, answered=pool.answered)
    install_health(app, Health(reachability, settings.source))
    install_page(app, settings.page.size)
    app.router.add_route("*", "/{tail:.*}", dispatch)
    return app


async def dispatch(request: web.Request) -> web.StreamResponse:
    """The one route: the handler the canonical path chose."""
    route = request[PATH_ROUTE]
    if route.kind == "forward":
        return await passthrough(request)
    if route.kind == "guarded":
        return await guarded(request)
    return await LOCAL_PATHS[route.path.value].handler(request)


async def _upstream_session(app: web.Application) -> AsyncIterator[None]:
    gateway = app[GATEWAY]
    # The pool (UpstreamPool) bounds calls in flight and says 503 when full; the connector must not queue too.
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, enable_cleanup_closed=True)
    async with upstream_session(connector) as session:
        gateway.session = session
        gateway.summariser = open_summariser(gateway.settings, session)
        await discover_upstreams(gateway, session)
        await gateway.store.open()  # connected before the first request, so it does not pay for it
        yield
        current = app[GATEWAY]  # a reload may have replaced the gateway the session was opened with
        current.session = current.summariser = None
    await app[GATEWAY].store.close()


async def discover_upstreams(gateway: Gateway, session: aiohttp.ClientSession) -> None:
    """Ask each self-hosted upstream what it is, once, at start (each under its own deadline): its
    window, whether it can tokenize. Hosted APIs and `generic` upstreams are not asked."""

    async def one(upstream: UpstreamSettings) -> None:
        options = upstream.backend_options
        if not upstream.provider.discovered:
            gateway.backends.discoveries[upstream.name] = Discovery(options.declared)
            return
        headers = gateway.service_headers(upstream, await _credential(gateway, upstream))
        found = await gateway.backends.discover(session, upstream.name, upstream.base_url, headers)
        gateway.log.info("upstream_discovered", upstream=upstream.name, kind=found.kind, flavor=found.flavor,
                         windows=dict(found.windows), notes=list(found.notes))  # fmt: skip

    await asyncio.gather(*(one(upstream) for upstream in gateway.settings.upstreams.values()))


async def _credential(gateway: Gateway, upstream: UpstreamSettings) -> str | None:
    try:
        return await gateway.auths[upstream.name].header(None, False)
    except GuardError:
        return None


@web.middleware
async def records(request: web.Request, handler: Handler) -> web.StreamResponse:
    drain = request.app[DRAIN]
    drain.started()  # in flight until the `finally` below, past the log line
    gateway = request.app[GATEWAY]
    request[FLOW] = flow = Flow(request, gateway, request_id_of(request.headers.get("x-request-id")))
    status = 500
    try:
        fresh = canonical_route(request)
        client_keys(request)
        if fresh is not None:  # a route is kept only for a request that passed the client-key check
            keep_route(request.app[GATEWAY], *fresh)
        response = await handler(request)
        status = CLIENT_CLOSED if flow.client_disconnected and not flow.delivered else response.status
        return response
    except GuardError as exc:
        flow.error, status = exc.code, exc.status
        if status == CLIENT_CLOSED:
            flow.client_disconnected = True
            raise
        return error_response(exc, request)
    except web.HTTPException as exc:  # aiohttp's own: 413 while reading, ...
        error: GuardError
        if isinstance(exc, web.HTTPRequestEntityTooLarge):
            error = PayloadTooLarge("the request body is over the configured limit")
        else:
            error = HTTPRefusal(exc.reason or "request failed", exc.status)
        flow.error, status = error.code, error.status
        return error_response(error, request)
    except (ConnectionResetError, asyncio.CancelledError):  # the client went away (handler cancellation)
        # After the whole answer (a stream's [DONE]) a client may close at once: it was answered.
        status = (flow.upstream_status or 200) if flow.delivered else CLIENT_CLOSED
        flow.client_disconnected = flow.client_disconnected or not flow.delivered
        raise
    except (KeyboardInterrupt, SystemExit, GeneratorExit):
        raise
    except BaseException as exc:  # a native library's panic (pyo3's PanicException) too
        # Never a closed connection: one log line (its traceback inside it) and an error in the API's own shape.
        gateway.log.exception(
            "unhandled_error", request_id=flow.request_id, path=flow.path, error_type=type(exc).__name__
        )
        flow.error = "internal_error"
        return error_response(GuardError("internal error in context-guard"), request)
    finally:
        try:
            flow.close(status)
            _write(request.app[GATEWAY], flow, request.app[RECENT])
        finally:
            # The flow holds the request and the request its flow: a cycle that only the collector
            # frees, and the collector is kept off the serving loop's young objects
            # (`proxy.server.threads.collector`), so every request's body and parse would wait for a
            # full collection. Broken here, they go when the request does.
            del request[FLOW]
            if (held := request.get(HELD_BODY)) is not None:
                held.release()  # the body's bytes go back to the budget: answered, refused or its client gone
            drain.finished()


def _write(gateway: Gateway, record: RequestRecord, recent: RecentDecisions) -> None:
    """The request's one log line, its metrics and its row on the page; a failure here must never
    lose the line."""
    try:
        gateway.metrics.observe(record)
    except Exception:  # metrics are best effort; the log line below is not
        gateway.log.exception("metrics_failed", request_id=record.request_id)
    if record.kind == "local" and is_probe(record.path) and record.status < 400:
        return  # probes every few seconds would drown the request log
    event = log_event(record, gateway.settings.log.max_line_bytes)
    log_request_line(gateway.log, record.is_warning, "request", event)
    recent.add(record)


def error_response(error: GuardError, request: web.Request) -> web.Response:
    """`error` in the shape of the API the request spoke, as its adapter renders it; for a request
    no adapter reads (a pass-through or local path, or one refused before its route), Google's on
    Google's own paths and OpenAI's elsewhere (`proxy.server.edge.paths.error_body`)."""
    record = request[FLOW]
    if error.status >= 500 and record.request_id not in error.message:  # what the operator's log is searched by
        error.message = f"{error.message} (request id {record.request_id})"
    route = request.get(PATH_ROUTE)
    endpoint = route.endpoint if route is not None else None
    body = endpoint.adapter.error_body(error) if endpoint is not None else error_body(error, record.path)
    response = web.json_response(body, status=error.status)
    response.headers.update(error.headers)
    if endpoint is not None:  # a shape that names its error in a header too (Bedrock's exception type)
        response.headers.update(endpoint.adapter.error_headers(error))
    response.headers["x-request-id"] = record.request_id
    if error.status in (408, 413):  # the rest of the body was never read: this connection cannot be reused
        response.force_close()
    elif error.status in (429, 503) and not request.content.is_eof() and request.protocol is not None:
        # Refused for the memory its body would take: the rest of it is not read, not even to be
        # discarded (aiohttp's lingering read): with many such clients, that reading is what held the loop.
        request.protocol.force_close()
    return response


def canonical_route(request: web.Request) -> tuple[tuple[str, str], PathRoute] | None:
    """The request's canonical path and the route it decides, kept on the request and its record;
    the key and route for the gateway to keep (`keep_route`) when it had none for them."""
    if "#" in request.raw_path:  # a fragment has no place in a request target; yarl would drop it silently
        raise InvalidPath("the request target holds a '#'")
    path = canonical_path(request.rel_url.raw_path)
    record = request[FLOW]
    record.path = path.value
    gw, key = request.app[GATEWAY], (path.value, request.method)
    route = gw.routes.get(key)
    fresh = None
    if route is None:  # worked out once per path and method (a refusal is raised, never kept)
        route = route_for(path, request.method, request.app[PASSTHROUGH], gw.apis.endpoint_for, local_name)
        fresh = (key, route)
    request[PATH_ROUTE] = route
    if route.kind == "guarded" and route.api is not None:
        record.kind = route.api
    return fresh


def keep_route(gw: Gateway, key: tuple[str, str], route: PathRoute) -> None:
    """Keep a path's route; when `ROUTES_KEPT` are kept, the oldest goes (worked out again if asked
    for), so that paths nobody sends again do not freeze the table."""
    routes = gw.routes
    if len(routes) >= ROUTES_KEPT:
        del routes[next(iter(routes))]
    routes[key] = route


def client_keys(request: web.Request) -> None:
    """Unauthorized unless the request holds one of the proxy's client keys (when any are set)."""
    settings = request.app[GATEWAY].settings
    keys = settings.server.client_keys
    # Whether the path is one the keys do not guard is asked last: only of a request without a key.
    if (
        keys
        and not holds_client_key(request.headers, keys)
        and not open_without_client_key(request[PATH_ROUTE].path.value, settings.server.metrics_public)
    ):
        raise Unauthorized(
            "a valid context-guard client key is required (Authorization: Bearer <key>, x-api-key, api-key or "
            "x-goog-api-key)"
        )
