"""`create_app(settings) -> web.Application`: routes, middlewares and the upstream session.

Three middlewares, in order: the outer one gives every request an id (the client's
`x-request-id` when it is short printable ASCII, else a fresh one) and turns every failure into
an OpenAI-shaped error (`{"error": {"message", "type", "param", "code"}}`); no traceback ever
reaches a client. The next reads the request's one canonical path (`proxy.server.paths`), which
alone decides the route. The inner one checks the proxy's own client keys, when configured, before
any body is read or inflated. One catch-all route then dispatches on the canonical path.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web

from proxy.errors import GuardError, PayloadTooLarge, Unauthorized
from proxy.guard import Guard
from proxy.logging import get_logger
from proxy.server.body import BODY_POLICY, JSON_LIMITS, UNREAD_BODY_LINGER_SECONDS, BodyPolicy
from proxy.server.credentials import UpstreamAuth, holds_client_key
from proxy.server.handlers import (
    GATEWAY,
    REQUEST_ID,
    Gateway,
    chat_completions,
    healthz,
    metrics,
    passthrough,
)
from proxy.server.metrics import Metrics
from proxy.server.paths import PASSTHROUGH, PATH_ROUTE, InvalidPath, PassthroughPolicy, canonical_path, route_for
from proxy.server.upstream import UPSTREAM_POOL, PoolPolicy, Router, UpstreamPool
from proxy.settings import Settings
from proxy.strict_json import JsonLimits

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
UNGUARDED_PATHS = frozenset({"/healthz", "/metrics"})
LOCAL_HANDLERS: dict[str, Handler] = {"healthz": healthz, "metrics": metrics}
GUARDED_HANDLERS: dict[str, Handler] = {"chat_completions": chat_completions}
REQUEST_ID_PATTERN = re.compile(r"[!-~]{1,128}")  # printable ASCII, no spaces, at most 128 characters


def create_app(
    settings: Settings,
    guard: Guard | None = None,
    *,
    passthrough: PassthroughPolicy | None = None,
    body: BodyPolicy | None = None,
    json_limits: JsonLimits | None = None,
    pool: PoolPolicy | None = None,
) -> web.Application:
    gateway = Gateway(
        settings=settings,
        guard=guard or Guard(settings),
        router=Router(settings),
        auths={name: UpstreamAuth(upstream) for name, upstream in settings.upstreams.items()},
        metrics=Metrics(),
        log=get_logger(),
    )
    # aiohttp enforces the body limit itself as it reads (413), so a huge body is never buffered whole.
    # aiohttp's own request decompression runs on the event loop before any check: off (see body.py).
    app = web.Application(
        client_max_size=settings.max_body_bytes,
        middlewares=[errors, canonical_route, client_keys],
        handler_args={"auto_decompress": False, "lingering_time": UNREAD_BODY_LINGER_SECONDS},
    )
    app[GATEWAY] = gateway
    app[PASSTHROUGH] = passthrough or PassthroughPolicy()
    app[BODY_POLICY] = body or BodyPolicy()
    app[JSON_LIMITS] = json_limits or JsonLimits()
    app[UPSTREAM_POOL] = UpstreamPool(pool or PoolPolicy())
    app.cleanup_ctx.append(_upstream_session)
    app.router.add_route("*", "/{tail:.*}", dispatch)
    return app


async def dispatch(request: web.Request) -> web.StreamResponse:
    """The one route: the handler the canonical path chose."""
    route = request[PATH_ROUTE]
    if route.kind == "forward":
        return await passthrough(request)
    handlers = GUARDED_HANDLERS if route.kind == "guarded" else LOCAL_HANDLERS
    return await handlers[route.api or ""](request)


async def _upstream_session(app: web.Application) -> AsyncIterator[None]:
    gateway = app[GATEWAY]
    # The pool (UpstreamPool) bounds calls in flight and says 503 when full; the connector must not queue too.
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, enable_cleanup_closed=True)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False, trust_env=False) as session:
        gateway.session = session
        yield
        gateway.session = None


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    request_id = request_id_of(request.headers.get("x-request-id"))
    request[REQUEST_ID] = request_id
    try:
        return await handler(request)
    except GuardError as exc:
        return error_response(exc, request_id)
    except web.HTTPRequestEntityTooLarge:
        return error_response(PayloadTooLarge("the request body is over the configured limit"), request_id)
    except web.HTTPException as exc:  # routing errors such as 405
        error = GuardError(exc.reason or "request failed")
        response = web.json_response(
            {"error": {"message": error.message, "type": "invalid_request_error", "param": None, "code": None}},
            status=exc.status,
        )
        response.headers["x-request-id"] = request_id
        return response
    except Exception:
        request.app[GATEWAY].log.exception("unhandled_error", request_id=request_id, path=request.path)
        return error_response(GuardError(f"internal error in context-guard (request id {request_id})"), request_id)


def request_id_of(given: str | None) -> str:
    """The client's request id when it is at most 128 printable ASCII characters; else a fresh one
    (a log line or response header must never carry what a client smuggled in)."""
    if given is not None and REQUEST_ID_PATTERN.fullmatch(given):
        return given
    return uuid.uuid4().hex


def error_response(error: GuardError, request_id: str) -> web.Response:
    body = error.to_openai()
    if error.status >= 500 and request_id not in error.message:  # what the operator's log is searched by
        body["error"]["message"] = f"{error.message} (request id {request_id})"
    response = web.json_response(body, status=error.status)
    response.headers.update(error.headers)
    response.headers["x-request-id"] = request_id
    if error.status in (408, 413):  # the rest of the body was never read: this connection cannot be reused
        response.force_close()
    return response


@web.middleware
async def canonical_route(request: web.Request, handler: Handler) -> web.StreamResponse:
    if "#" in request.raw_path:  # a fragment has no place in a request target; yarl would drop it silently
        raise InvalidPath("the request target holds a '#'")
    path = canonical_path(request.rel_url.raw_path)
    request[PATH_ROUTE] = route_for(path, request.method, request.app[PASSTHROUGH])
    return await handler(request)


@web.middleware
async def client_keys(request: web.Request, handler: Handler) -> web.StreamResponse:
    keys = request.app[GATEWAY].settings.client_keys
    if keys and request[PATH_ROUTE].path.value not in UNGUARDED_PATHS and not holds_client_key(request.headers, keys):
        raise Unauthorized(
            "a valid context-guard client key is required (Authorization: Bearer <key>, x-api-key or api-key)"
        )
    return await handler(request)
