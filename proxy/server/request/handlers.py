"""Request handlers: a thin loop that performs what the core's exchange asks.

A guarded request (any API shape an adapter in `proxy.apis` understands) is read and parsed by
the adapter its route names into the chat view the core counts; `proxy.server.request.perform.prepared`
opens its exchange, and `proxy.core.exchange.Exchange` then yields commands (find the route,
choose the tokenizer, look up a correction, plan, recount, summarise, send, remember, reject,
relay) that `Performer` performs and answers, until the exchange is over. What each step
works out is kept on the request's `Flow`, which is its record: the `records` middleware closes,
logs and counts it when the request ends.
"""

from __future__ import annotations

import re
from typing import Any

from aiohttp import web

from proxy.apis.base import Parsed
from proxy.apis.registry import Endpoint
from proxy.config.budget_and_trim import MODES, Mode
from proxy.core.commands import Command
from proxy.errors import BadRequest
from proxy.server.edge.body import bad_body_errors, read_body
from proxy.server.edge.credentials import credential_digest
from proxy.server.edge.paths import PATH_ROUTE
from proxy.server.observation.record import ANSWERED_LOCALLY, COUNT_HEADER, OUTCOME_HEADER
from proxy.server.request.flow import FLOW, Flow
from proxy.server.request.gateway import GATEWAY, MODE_HEADER, Gateway
from proxy.server.request.held import counted_with_held
from proxy.server.request.perform import prepared
from proxy.server.threads.placement import client_key, client_scope, performed, planned
from proxy.wire.prefix_reader import Match
from proxy.wire.readers import earlier_body, read_chat_body


async def guarded(request: web.Request) -> web.StreamResponse:
    """Every counted API shape: read, parse, then perform the exchange's commands until it is over."""
    flow = request[FLOW]
    gw = flow.gw
    endpoint = request[PATH_ROUTE].endpoint
    assert endpoint is not None, "the canonical-path middleware routed here only paths an adapter counts"
    flow.endpoint = endpoint
    digest = credential_digest(request.headers, request.query)  # who the client is, for its share and its counts
    client = flow.client = client_key(digest, request.remote)  # its share of bodies held, threads and upstream calls
    raw = flow.raw = await read_body(request, gw.settings.server.max_body_bytes, client)
    # What is new in the body is read and counted: a conversation re-sent with a turn is small work.
    match = gw.readers.match(endpoint.adapter, raw)
    large = flow.large = match.new_bytes > gw.settings.server.offload_bytes
    try:
        parsed = await performed(large, _parse, gw, endpoint, raw, match, size=match.new_bytes, client=client)
    except BadRequest:
        flow.model = endpoint.path_model or named_model(raw)  # a refused request's row still names its model
        raise
    flow.parsed, model = parsed, parsed.model or ""
    flow.model = model
    flow.scope = client_scope(request, digest)  # whose part of the count cache this request reads and fills
    if endpoint.local:  # Anthropic's count_tokens, Gemini's countTokens: answered from the same count, never forwarded
        return await _count_tokens(flow)
    performer, exchange = prepared(flow, select_mode(request, gw, model))
    command: Command | None = exchange.start()
    while command is not None:
        command = exchange.send(await performer.perform(command))
    assert performer.response is not None, "an exchange ends with an answer relayed, or raises"
    return performer.response


_NAMED_MODEL = re.compile(rb'"model"\s*:\s*"([^"\\]{1,256})"')
_MODEL_PEEK_BYTES = 4096


def named_model(raw: bytes) -> str | None:
    """The model a body that could not be parsed names near its start, for its log line and row
    (bounded: the first 4 KiB only, never a second parse of a refused body)."""
    found = _NAMED_MODEL.search(raw[:_MODEL_PEEK_BYTES])
    return found.group(1).decode("utf-8", "replace") if found else None


def _parse(gw: Gateway, endpoint: Endpoint, raw: bytes, match: Match | None = None) -> Parsed:
    """The body read strictly (duplicate keys, depth, encoding) and parsed by its API's adapter
    (the chat adapter type-checks every field the core reads); a conversation re-sent with a new
    turn is read and checked only where it is new, and a body sent again as it was is the request
    parsed the last time (`proxy.wire.readers`)."""
    if match is not None and match.same:
        kept = gw.parses.get(match.earlier, endpoint)
        if kept is not None:
            gw.readers.used_again(endpoint.adapter, match)
            return kept
    with bad_body_errors():
        reading = gw.readers.read(endpoint.adapter, raw, match)
        parsed = endpoint.parse(reading.value, reading.known)
    gw.readers.accepted(endpoint.adapter, reading, seen_whole=not parsed.unseen)
    gw.parses.put(earlier_body(parsed), endpoint, parsed)  # a body sent again: its request, for the next time
    return parsed


async def _count_tokens(flow: Flow) -> web.Response:
    """A count endpoint (Anthropic's count_tokens, Gemini's countTokens), counted where a request
    is planned (sized by the whole body, within the client's share of the threads; its scope: its
    part of the count cache)."""
    gw, endpoint, parsed = flow.gw, flow.endpoint, flow.parsed
    fit, adapter, scope = gw.models.fit, endpoint.adapter, flow.scope
    size, client = len(flow.raw), flow.client
    fitted = await planned(flow.large, fit, adapter, parsed, None, None, scope, size=size, client=client)
    flow.plan, flow.outcome = fitted.plan, ANSWERED_LOCALLY  # counted, never cut nor forwarded
    assert endpoint.answer is not None, "a local endpoint says how it answers"
    total, kind = fitted.plan.count.total, "exact" if fitted.exact else "upper-bound"
    if parsed.held:  # a cache it names: added as the provider counts it (`proxy.server.request.held`)
        total, kind = await counted_with_held(flow, total, fitted.plan.count.exact)
    response = web.json_response(adapter.count_answer(endpoint.answer(total), fitted.original_tokens))
    response.headers["x-request-id"] = flow.request_id
    # The body has no field for it: what kind of count this is (an upper bound where no tokenizer of the model ships).
    response.headers[COUNT_HEADER] = kind
    response.headers[OUTCOME_HEADER] = ANSWERED_LOCALLY
    return response


async def metrics(request: web.Request) -> web.Response:
    body = request.app[GATEWAY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


def parse_chat(raw: bytes) -> dict[str, Any]:
    """A chat-completions body read as the guard reads it (for the echo upstream and tools)."""
    with bad_body_errors():
        return read_chat_body(raw)


def select_mode(request: web.Request, gw: Gateway, model: str) -> Mode:
    if gw.settings.server.allow_mode_header and (value := request.headers.get(MODE_HEADER)):
        if value not in MODES:
            raise BadRequest(f"{MODE_HEADER} must be one of {', '.join(MODES)}", param=MODE_HEADER)
        return value  # type: ignore[return-value,unused-ignore]  # checked against MODES above
    return gw.models.mode_for(model)
