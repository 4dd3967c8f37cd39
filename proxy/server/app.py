"""`create_app(settings) -> web.Application`: routes, middlewares and the upstream session.

Two middlewares: the outer one gives every request an id and turns every failure into an
OpenAI-shaped error (`{"error": {"message", "type", "param", "code"}}`); no traceback ever
reaches a client. The inner one checks the proxy's own client keys, when configured.
"""

from __future__ import annotations

import hmac
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web

from proxy.errors import GuardError, PayloadTooLarge, Unauthorized
from proxy.guard import Guard
from proxy.logging import get_logger
from proxy.server.credentials import UpstreamAuth
from proxy.server.handlers import (
    GATEWAY,
    REQUEST_ID,
    Gateway,
    chat_completions,
    metrics,
    passthrough,
)
from proxy.server.health import HEALTH_PATHS, Health, Reachability, ReadinessOptions, install_health
from proxy.server.lifecycle import install_drain, track_requests
from proxy.server.metrics import Metrics
from proxy.server.upstream import Router
from proxy.settings import Settings

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
UNGUARDED_PATHS = HEALTH_PATHS | {"/metrics"}


def create_app(
    settings: Settings, guard: Guard | None = None, readiness: ReadinessOptions | None = None
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
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[track_requests, errors, client_keys])
    app[GATEWAY] = gateway
    install_drain(app)
    app.cleanup_ctx.append(_upstream_session)
    upstreams = {name: upstream.base_url for name, upstream in settings.upstreams.items()}
    install_health(app, Health(Reachability(upstreams, readiness or ReadinessOptions()), settings.source))
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/chat/completions", chat_completions)
    app.router.add_route("*", "/{tail:.*}", passthrough)
    return app


async def _upstream_session(app: web.Application) -> AsyncIterator[None]:
    gateway = app[GATEWAY]
    connector = aiohttp.TCPConnector(limit=512, limit_per_host=0, enable_cleanup_closed=True)
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False, trust_env=False) as session:
        gateway.session = session
        yield
        gateway.session = None


@web.middleware
async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
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


def error_response(error: GuardError, request_id: str) -> web.Response:
    response = web.json_response(error.to_openai(), status=error.status)
    response.headers.update(error.headers)
    response.headers["x-request-id"] = request_id
    return response


@web.middleware
async def client_keys(request: web.Request, handler: Handler) -> web.StreamResponse:
    keys = request.app[GATEWAY].settings.client_keys
    if keys and request.path not in UNGUARDED_PATHS:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not any(hmac.compare_digest(given.strip(), key) for key in keys):
            raise Unauthorized("a valid context-guard client key is required (Authorization: Bearer <key>)")
    return await handler(request)
