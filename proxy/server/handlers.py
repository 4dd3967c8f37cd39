"""Request handlers: chat completions (parse -> plan -> forward -> log), pass-through, health, metrics.

A chat request is counted, budgeted and trimmed by the core, then forwarded: byte for byte when
nothing needed to change, re-serialised with every other field intact when something did. If the
upstream still answers that the context is too long, its own count tightens the budget for that
model, and the request is cut again and retried once; nothing has reached the client by then.
Each request ends in one log event saying what was removed, never what it said.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from proxy.chat_body import read_chat_body
from proxy.codec import dumps, loads
from proxy.core.corrections import Correction, CorrectionMemory, parse_overflow
from proxy.core.plan import InvalidBody, Plan
from proxy.errors import BadRequest, ClientDisconnected, ContextLengthExceeded, GuardError, ModelNotRouted
from proxy.guard import Guard
from proxy.server import body as request_body
from proxy.server.credentials import UpstreamAuth, without_client_keys
from proxy.server.metrics import Metrics
from proxy.server.paths import PATH_ROUTE, upstream_url
from proxy.server.upstream import (
    UPSTREAM_POOL,
    Router,
    Target,
    decoded,
    read_error_body,
    relay,
    request_headers,
    response_headers,
    send,
)
from proxy.settings import MODES, Mode, Settings
from proxy.strict_json import JsonLimits

MODE_HEADER = "x-context-guard-mode"
REQUEST_ID = web.RequestKey("request_id", str)  # set on every request by the error middleware


@dataclass
class Gateway:
    """Everything the handlers share, built once per app."""

    settings: Settings
    guard: Guard
    router: Router
    auths: dict[str, UpstreamAuth]
    metrics: Metrics
    log: Any
    corrections: CorrectionMemory = field(default_factory=CorrectionMemory)
    session: aiohttp.ClientSession | None = None


GATEWAY = web.AppKey("gateway", Gateway)


@dataclass
class Exchange:
    """One chat request as it goes through the handler: what the log line will say."""

    request_id: str
    model: str
    mode: Mode
    target: Target
    body: dict[str, Any] = field(default_factory=dict)  # as received, for opt-in removal previews
    started: float = field(default_factory=time.perf_counter)
    plan: Plan | None = None  # the latest plan (a self-correction replaces the first)
    fields: dict[str, Any] = field(default_factory=dict)  # what else the log line will say


async def chat_completions(request: web.Request) -> web.StreamResponse:
    gw = request.app[GATEWAY]
    started = time.perf_counter()
    try:
        raw = await read_body(request, gw.settings.max_body_bytes)
        large = len(raw) > gw.settings.offload_bytes
        limits = request.app[request_body.JSON_LIMITS]
        body = await asyncio.to_thread(parse_chat, raw, limits) if large else parse_chat(raw, limits)
        model: str = body["model"]
        mode, target = select_mode(request, gw, model), gw.router.route(model)
    except GuardError as exc:  # refused before it could be routed: still one log event
        gw.metrics.requests.labels("chat", "invalid", str(exc.status)).inc()
        elapsed_ms = round((time.perf_counter() - started) * 1000, 2)
        gw.log.info(
            "request",
            request_id=request.get(REQUEST_ID, ""),
            status=exc.status,
            outcome="invalid",
            error=exc.code,
            param=exc.param,
            total_ms=elapsed_ms,
        )
        raise
    exchange = Exchange(request.get(REQUEST_ID, ""), model, mode, target, body, started)
    status = 500
    try:
        response = await _handle_chat(request, gw, exchange, raw, body)
        status = _final_status(exchange, response)
        return response
    except asyncio.CancelledError:  # the client went away while we waited (run.py cancels its handler)
        status = ClientDisconnected.status
        exchange.fields["error"] = ClientDisconnected.code
        raise
    except Exception as exc:
        status = getattr(exc, "status", 500)
        exchange.fields.setdefault("error", type(exc).__name__)
        raise
    finally:
        _log_chat(gw, exchange, status)


async def _handle_chat(
    request: web.Request, gw: Gateway, exchange: Exchange, raw: bytes, body: dict[str, Any]
) -> web.StreamResponse:
    if exchange.mode == "off":
        return await _forward(request, gw, exchange, _outgoing(exchange, body, raw), {}, None, body)

    plan = await _plan(gw, exchange, body, len(raw))
    headers = _report_headers(plan, exchange)
    result = plan.result
    if exchange.mode == "enforce" and result.outcome == "rejected":
        gw.metrics.rejections.labels(exchange.model).inc()
        raise ContextLengthExceeded(result.rejection_message(), param="messages", headers=headers)
    if exchange.mode == "enforce" and result.changed:
        gw.metrics.trims.labels(exchange.model).inc()
        gw.metrics.tokens_removed.labels(exchange.model).inc(result.tokens_before - result.tokens_after)
        payload = _outgoing(exchange, result.body)
    else:
        payload = _outgoing(exchange, body, raw)
    return await _forward(request, gw, exchange, payload, headers, plan if exchange.mode == "enforce" else None, body)


async def _forward(
    request: web.Request,
    gw: Gateway,
    exchange: Exchange,
    payload: bytes,
    headers: dict[str, str],
    plan: Plan | None,
    body: dict[str, Any],
) -> web.StreamResponse:
    """Send `payload`; on a context-length error from upstream, correct, re-plan and retry once."""
    upstream = exchange.target.upstream
    extra = {"x-request-id": exchange.request_id, **headers}
    async with _upstream_call(request, gw, exchange, payload) as response:
        if response.status < 400 or plan is None or not gw.settings.self_correction:
            return await _relay(request, gw, exchange, response, extra)
        error_body = await read_error_body(upstream, response)
        overflow = parse_overflow(response.status, decoded(error_body, response.headers.get("Content-Encoding")))
        upstream_answer = _buffered(response, error_body, extra)
        if overflow is None:
            return upstream_answer
    # The upstream counted more than we did: learn by how much, cut again, try once more.
    budget = plan.result.budget
    correction = gw.corrections.remember(
        exchange.model,
        Correction.measure(overflow, plan.result.tokens_after, budget.context_window, budget.output_reserve),
    )
    exchange.fields["self_correction"] = {
        "provider": overflow.provider,
        "provider_limit": overflow.limit,
        "provider_prompt_tokens": overflow.prompt_tokens,
        "our_prompt_tokens": plan.result.tokens_after,
        "corrected_window": correction.window,
    }
    retry = await _plan(gw, exchange, body, len(payload))
    retry_headers = {"x-request-id": exchange.request_id, **_report_headers(retry, exchange)}
    if retry.result.outcome == "rejected":
        gw.metrics.corrections.labels(exchange.model, "rejected").inc()
        raise ContextLengthExceeded(retry.result.rejection_message(), param="messages", headers=retry_headers)
    if retry.result.outcome != "trimmed":  # `overflow: forward` and still too long: sending it again cannot help
        gw.metrics.corrections.labels(exchange.model, "not_retried").inc()
        return upstream_answer
    gw.metrics.corrections.labels(exchange.model, "retried").inc()
    async with _upstream_call(request, gw, exchange, _outgoing(exchange, retry.result.body)) as response:
        return await _relay(request, gw, exchange, response, retry_headers)


def _outgoing(exchange: Exchange, body: Mapping[str, Any], raw: bytes | None = None) -> bytes:
    """The bytes to send upstream: `raw`, as received, when nothing changes; otherwise `body`
    serialised, with the model renamed when the route says so."""
    renamed = exchange.target.model != exchange.model
    if raw is not None and not renamed:
        return raw
    return dumps({**body, "model": exchange.target.model} if renamed else body)


@contextlib.asynccontextmanager
async def _upstream_call(
    request: web.Request, gw: Gateway, exchange: Exchange, payload: bytes
) -> AsyncIterator[aiohttp.ClientResponse]:
    """`send()` with auth, URL and headers resolved, and its time and failures recorded."""
    upstream = exchange.target.upstream
    keys = gw.settings.client_keys
    auth = await gw.auths[upstream.name].header(request.headers.get("Authorization"), bool(keys))
    query = without_client_keys(request.rel_url.raw_query_string, keys)  # as received, less the proxy's keys
    url = upstream_url(upstream.base_url, request[PATH_ROUTE].path, query)
    headers = request_headers(request.headers, upstream, auth, keys)
    assert gw.session is not None, "the app's upstream session is opened at startup"
    started = time.perf_counter()
    try:
        pool = request.app[UPSTREAM_POOL]
        async with send(gw.session, upstream, request.method, url, headers, payload, pool) as response:
            exchange.fields["upstream_status"] = response.status
            yield response
    except GuardError as exc:  # the upstream's failures, as upstream_errors() mapped them
        gw.metrics.upstream_errors.labels(upstream.name, type(exc).__name__).inc()
        raise
    finally:
        elapsed = time.perf_counter() - started
        exchange.fields["upstream_ms"] = round(exchange.fields.get("upstream_ms", 0) + elapsed * 1000, 2)
        gw.metrics.duration.labels("upstream").observe(elapsed)


async def _relay(
    request: web.Request, gw: Gateway, exchange: Exchange, response: aiohttp.ClientResponse, extra: dict[str, str]
) -> web.StreamResponse:
    relayed = await relay(request, exchange.target.upstream, response, extra)
    if relayed.broken:
        exchange.fields["stream_broken"] = relayed.broken
        gw.metrics.upstream_errors.labels(exchange.target.upstream.name, "stream_broken").inc()
    if relayed.client_gone:
        exchange.fields["error"] = ClientDisconnected.code
    return relayed.response


def _final_status(exchange: Exchange, response: web.StreamResponse) -> int:
    """The status the log records: 499 when the client left before the whole answer reached it."""
    return ClientDisconnected.status if exchange.fields.get("error") == ClientDisconnected.code else response.status


def _buffered(response: aiohttp.ClientResponse, body: bytes, extra: dict[str, str]) -> web.Response:
    out = web.Response(status=response.status, reason=response.reason, body=body)
    out.headers.update(response_headers(response.headers))
    out.headers.update(extra)
    return out


async def _plan(gw: Gateway, exchange: Exchange, body: dict[str, Any], size: int) -> Plan:
    correction = gw.corrections.get(exchange.model)
    window = None
    if correction is not None:
        window = min(correction.window, gw.guard.profile(exchange.model).context_window)
    if size > gw.settings.offload_bytes:  # tiktoken releases the GIL: other requests keep flowing
        plan = await asyncio.to_thread(gw.guard.plan, body, exchange.model, window)
    else:
        plan = gw.guard.plan(body, exchange.model, window)
    gw.metrics.duration.labels("count").observe(plan.count_seconds)
    gw.metrics.duration.labels("trim").observe(plan.trim_seconds)
    exchange.plan = plan
    return plan


def _report_headers(plan: Plan, exchange: Exchange) -> dict[str, str]:
    result = plan.result
    return {
        "x-context-guard-tokens-before": str(result.tokens_before),
        "x-context-guard-tokens-after": str(result.tokens_after),
        "x-context-guard-budget": str(result.budget.input_budget),
        "x-context-guard-removed": str(len(result.removals)),
        "x-context-guard-mode": exchange.mode,
    }


def _log_chat(gw: Gateway, exchange: Exchange, status: int) -> None:
    total = time.perf_counter() - exchange.started
    gw.metrics.duration.labels("total").observe(total)
    fields = exchange.fields
    plan = exchange.plan
    event: dict[str, Any] = {
        "request_id": exchange.request_id,
        "model": exchange.model,
        "upstream": exchange.target.upstream.name,
        "mode": exchange.mode,
        "status": status,
    }
    outcome = "forwarded"
    if plan is not None:
        result, profile = plan.result, gw.guard.profile(exchange.model)
        outcome = result.outcome if exchange.mode == "enforce" else f"dry_run_{result.outcome}"
        event.update(
            context_window=result.budget.context_window,
            window_source=profile.window_source,
            budget=result.budget.input_budget,
            is_constrained=result.budget.is_constrained(gw.settings.trim.budget),
            tokens_before=result.tokens_before,
            tokens_after=result.tokens_after,
            tokenizer=plan.count.tokenizer,
            exact=plan.count.exact,
            removed=[_removal(r, exchange.body, gw.settings.content_preview_chars) for r in result.removals],
            strategies=list(result.strategies),
            count_ms=round(plan.count_seconds * 1000, 2),
            trim_ms=round(plan.trim_seconds * 1000, 2),
        )
    event.update(outcome=outcome, **fields, total_ms=round(total * 1000, 2))
    gw.metrics.requests.labels("chat", outcome, str(status)).inc()
    # A request sent on over budget (`overflow: forward`) or a server-side failure is worth a warning.
    warn = status >= 500 or outcome.endswith("forwarded_over_budget")
    (gw.log.warning if warn else gw.log.info)("request", **event)


def _removal(removal: Any, body: dict[str, Any], preview_chars: int) -> dict[str, Any]:
    """A removal for the log; with `log.content_preview_chars` set, the start of what was removed."""
    entry: dict[str, Any] = removal.to_dict()
    if preview_chars > 0 and removal.index is not None:
        entry["preview"] = _message_text(body, removal.index)[:preview_chars]
    return entry


def _message_text(body: dict[str, Any], index: int) -> str:
    messages = body.get("messages") or []
    message = messages[index] if index < len(messages) else {}
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else ""


async def passthrough(request: web.Request) -> web.StreamResponse:
    """Any other path: forwarded untouched (method, query, headers, body), routed by the body's
    `model` when it names one, else to the default upstream."""
    gw = request.app[GATEWAY]
    raw = await read_body(request, gw.settings.max_body_bytes)
    model = _sniff_model(request, raw)
    try:
        target = gw.router.route(model) if model else gw.router.default()
    except ModelNotRouted:
        target = gw.router.default()
    exchange = Exchange(request.get(REQUEST_ID, ""), model or "", gw.settings.mode, target)
    status = 500
    try:
        async with _upstream_call(request, gw, exchange, raw) as response:
            out = await _relay(request, gw, exchange, response, {"x-request-id": exchange.request_id})
        status = _final_status(exchange, out)
        return out
    except asyncio.CancelledError:
        status = ClientDisconnected.status
        exchange.fields["error"] = ClientDisconnected.code
        raise
    except GuardError as exc:
        status = exc.status
        raise
    finally:
        gw.metrics.requests.labels("passthrough", "forwarded", str(status)).inc()
        gw.log.info(
            "passthrough",
            request_id=exchange.request_id,
            method=request.method,
            path=request[PATH_ROUTE].path.value,
            upstream=target.upstream.name,
            status=status,
            **exchange.fields,
            total_ms=round((time.perf_counter() - exchange.started) * 1000, 2),
        )


def _sniff_model(request: web.Request, raw: bytes) -> str | None:
    if not raw or "json" not in request.content_type or len(raw) > 4 * 1024 * 1024:
        return None
    try:
        data = loads(raw)
    except ValueError:
        return None
    model = data.get("model") if isinstance(data, dict) else None
    return model if isinstance(model, str) and model else None


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def metrics(request: web.Request) -> web.Response:
    body = request.app[GATEWAY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


async def read_body(request: web.Request, limit: int) -> bytes:
    return await request_body.read_body(request, limit, request.app[request_body.BODY_POLICY])


def parse_chat(raw: bytes, limits: JsonLimits) -> dict[str, Any]:
    try:
        return read_chat_body(raw, limits)
    except InvalidBody as exc:
        raise BadRequest(str(exc), param=exc.param) from None


def select_mode(request: web.Request, gw: Gateway, model: str) -> Mode:
    if gw.settings.allow_mode_header and (value := request.headers.get(MODE_HEADER)):
        if value not in MODES:
            raise BadRequest(f"{MODE_HEADER} must be one of {', '.join(MODES)}", param=MODE_HEADER)
        return value
    return gw.guard.mode_for(model)
