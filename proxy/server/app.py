"""`create_app(settings) -> web.Application`: routes, middlewares and the upstream session.

Two middlewares. The outer one, `records`, opens the request's `RequestRecord` (with a request
id it can trust), turns every failure into an OpenAI-shaped error (no traceback ever reaches a
client), and when the request ends, however it ends, writes its one log line and its metrics.
The inner one checks the proxy's own client keys, when configured.
"""

from __future__ import annotations

import asyncio
import hmac
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
from aiohttp import web

from proxy.errors import GuardError, HTTPRefusal, PayloadTooLarge, Unauthorized
from proxy.guard import Guard
from proxy.logging import get_logger
from proxy.server.credentials import UpstreamAuth
from proxy.server.handlers import (
    GATEWAY,
    RECORD,
    Gateway,
    chat_completions,
    metrics,
    passthrough,
)
from proxy.server.health import HEALTH_PATHS, Health, Reachability, install_health
from proxy.server.lifecycle import install_drain, track_requests
from proxy.server.metrics import Metrics
from proxy.server.record import RequestRecord, log_event
from proxy.server.upstream import Router
from proxy.settings import Settings
from proxy.state import open_store

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
CLIENT_CLOSED = 499  # nginx's code for a client that went away before its answer


def build_gateway(settings: Settings, guard: Guard | None = None) -> Gateway:
    guard = guard or Guard(settings)
    log = get_logger()
    store = open_store(settings.state, log)
    return Gateway(
        settings=settings,
        guard=guard,
        router=Router(settings),
        auths={name: UpstreamAuth(upstream) for name, upstream in settings.upstreams.items()},
        metrics=Metrics(guard.model_label, store.status),
        log=log,
        store=store,
    )


def create_app(settings: Settings, guard: Guard | None = None) -> web.Application:
    gateway = build_gateway(settings, guard)
    # aiohttp enforces the body limit itself as it reads (413), so a huge body is never buffered whole.
    app = web.Application(
        client_max_size=settings.server.max_body_bytes, middlewares=[track_requests, records, client_keys]
    )
    app[GATEWAY] = gateway
    install_drain(app)
    app.cleanup_ctx.append(_upstream_session)
    upstreams = {name: upstream.base_url for name, upstream in settings.upstreams.items()}
    install_health(app, Health(Reachability(upstreams, settings.readiness), settings.source))
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/chat/completions", chat_completions)
    app.router.add_route("*", "/{tail:.*}", passthrough)
    return app


async def _upstream_session(app: web.Application) -> AsyncIterator[None]:
    gateway = app[GATEWAY]
    connector = aiohttp.TCPConnector(
        limit=gateway.settings.server.upstream_connections, limit_per_host=0, enable_cleanup_closed=True
    )
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False, trust_env=False) as session:
        gateway.session = session
        yield
        gateway.session = None
    await app[GATEWAY].store.close()


def trusted_request_id(given: str | None) -> str:
    """The client's `x-request-id` when it is short printable ASCII, else a fresh one."""
    if given and len(given) <= 128 and given.isascii() and given.isprintable():
        return given
    return uuid.uuid4().hex


@web.middleware
async def records(request: web.Request, handler: Handler) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    record = RequestRecord(trusted_request_id(request.headers.get("x-request-id")), request.method, request.path)
    request[RECORD] = record
    status = 500
    try:
        response = await handler(request)
        status = CLIENT_CLOSED if record.client_disconnected else response.status
        return response
    except GuardError as exc:
        record.error, status = exc.code, exc.status
        return error_response(exc, record.request_id)
    except web.HTTPException as exc:  # aiohttp's own: 405, 413 while reading, ...
        if isinstance(exc, web.HTTPRequestEntityTooLarge):
            error: GuardError = PayloadTooLarge("the request body is over the configured limit")
        else:
            error = HTTPRefusal(exc.reason or "request failed", exc.status)
        record.error, status = error.code, error.status
        return error_response(error, record.request_id)
    except (asyncio.CancelledError, ConnectionResetError):
        status = CLIENT_CLOSED
        record.client_disconnected = True
        raise
    except Exception:
        gateway.log.exception("unhandled_error", request_id=record.request_id, path=record.path)
        record.error = "internal_error"
        return error_response(GuardError(f"internal error in context-guard (request id {record.request_id})"),
                              record.request_id)  # fmt: skip
    finally:
        record.finish(status)
        _write(gateway, record)


def _write(gateway: Gateway, record: RequestRecord) -> None:
    """The request's one log line and its metrics; a failure here must never lose the line."""
    try:
        gateway.metrics.observe(record)
    except Exception:  # metrics are best effort; the log line below is not
        gateway.log.exception("metrics_failed", request_id=record.request_id)
    if record.kind == "local" and record.path in HEALTH_PATHS and record.status < 400:
        return  # probes every few seconds would drown the request log
    event = log_event(record, gateway.settings.log.max_line_bytes)
    (gateway.log.warning if record.is_warning else gateway.log.info)("request", **event)


def error_response(error: GuardError, request_id: str) -> web.Response:
    response = web.json_response(error.to_openai(), status=error.status)
    response.headers.update(error.headers)
    response.headers["x-request-id"] = request_id
    return response


def _given_key(request: web.Request) -> str:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and given.strip():
        return given.strip()
    return request.headers.get("x-api-key") or request.headers.get("api-key") or ""


@web.middleware
async def client_keys(request: web.Request, handler: Handler) -> web.StreamResponse:
    settings = request.app[GATEWAY].settings
    keys = settings.server.client_keys
    open_path = request.path in HEALTH_PATHS or (request.path == "/metrics" and settings.server.metrics_public)
    if keys and not open_path:
        given = _given_key(request).encode("utf-8", "surrogateescape")
        if not any(hmac.compare_digest(given, key.encode()) for key in keys):
            raise Unauthorized("a valid context-guard client key is required (Authorization: Bearer <key>)")
    return await handler(request)
