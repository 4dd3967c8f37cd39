"""The context the provider holds for one request, looked up (`LookUpHeld`) and learned.

A request names held context by id (`Parsed.held`: a stored response, a conversation, an
interaction, a cached prompt). What it weighs comes, in order, from:
- the ledger (`proxy.state.store`): the answers the guard relayed to this client said it;
- the provider's own count: OpenAI's `POST /responses/input_tokens` with the request's own fields
  counts the whole request, held and sent (`proxy.server.backends.provider_count`); Gemini's
  `GET cachedContents/{id}` says a cache's `totalTokenCount` and `expireTime` (kept then);
- else it is unknown, and the request is counted as sent, flagged.
Both calls carry the forwarded request's own credential, so a client learns nothing through them
that the provider would not tell it. `learned()` keeps what a relayed answer reports as held.

The same count call, with the same credential, serves a request whose bounds straddle its budget
(`provider_plan`), and a count endpoint answered locally adds the held context it names
(`count_answer`: Anthropic's count_tokens, Gemini's countTokens).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from aiohttp import web

from proxy.apis.base import HeldContext
from proxy.config.upstreams import UpstreamSettings
from proxy.core.commands import Held
from proxy.core.counting.tokenizer import Tokenizer
from proxy.core.plan import Plan
from proxy.errors import ContextLengthExceeded, GuardError
from proxy.server.backends.profiles import BackendDown, answered_json
from proxy.server.backends.provider_count import (
    EdgeRequest,
    Placed,
    count_call_headers,
    edge_budget,
    provider_counted,
    settled,
)
from proxy.server.edge.paths import host_root_url
from proxy.server.observation.record import ANSWERED_LOCALLY, COUNT_HEADER, OUTCOME_HEADER
from proxy.server.request.flow import Flow
from proxy.server.request.gateway import Gateway
from proxy.server.threads.placement import planned
from proxy.server.upstream.usage import Reported, held_of
from proxy.state.store import client_of


def ledger_client(flow: Flow) -> str:
    """Whose entries the request reads and writes: its credential's (`flow.scope`), else anonymous."""
    scope = flow.scope
    digest = scope[1] if isinstance(scope, tuple) and scope and scope[0] == "key" else None
    return client_of(digest if isinstance(digest, bytes) else None)


async def looked_up(flow: Flow, headers: Mapping[str, str], placed: Placed) -> Held:
    """What the held context `flow`'s request names weighs (`headers`: the count call's, the
    forwarded request's credential; `placed`: where a count call's body is built)."""
    gw, upstream = flow.gw, flow.target.upstream
    client, known, unknown = ledger_client(flow), 0, []
    for held in flow.parsed.held:
        size = await gw.ledger.get(upstream.name, client, held.kind, held.id)
        if size is None:
            unknown.append(held)
        else:
            known += size.tokens
    if not unknown:
        return Held(known, "ledger")
    provider = upstream.provider
    if any(held.kind in provider.counts_held_with_request for held in unknown):  # OpenAI's input_tokens
        whole = await _whole_count(flow, headers, placed)
        if whole is not None:
            return Held(None, "provider", whole=whole)
    for held in list(unknown):  # what the provider says of each (Gemini's cachedContents)
        path = provider.held_size_path(upstream.base_url, held.kind, held.id)
        tokens = None if path is None else await _held_size(flow, held, path, headers)
        if tokens is not None:
            known += tokens
            unknown.remove(held)
    if not unknown:  # every one the ledger did not know, the provider said
        return Held(known, "provider")
    return Held(known or None, "partial" if known else "unknown")


async def _whole_count(flow: Flow, headers: Mapping[str, str], placed: Placed) -> int | None:
    """The provider's count of the whole request, held context included (its count endpoint)."""
    gw, route = flow.gw, flow.route
    if route is None or gw.session is None:  # a count endpoint answered locally: no route was worked out
        return None
    return await provider_counted(gw.provider_counts, gw.session, headers, _edge_request(flow, route.served), placed)


def _edge_request(flow: Flow, served: str) -> EdgeRequest:
    """The provider count call for `flow`'s request, to the model that serves it; signed as the
    forwarded request is, where the provider signs."""
    gw, upstream, view = flow.gw, flow.target.upstream, flow.endpoint.adapter.body_is_view
    edge = EdgeRequest.of(upstream, served, flow.parsed, gw.backends.discoveries, view)
    return replace(edge, finish=gw.auths[upstream.name].finished) if upstream.provider.signs else edge


async def provider_plan(flow: Flow, plan: Plan, tokenizer: Tokenizer, placed: Placed) -> Plan | None:
    """The upstream's own count of a request whose plan's bounds may straddle its budget
    (`proxy.server.backends.provider_count`); its plan when that count decided (`count_source: provider`)."""
    gw, route = flow.gw, flow.route
    assert route is not None and gw.session is not None, "a plan follows the route; the session opens at startup"
    edge = _edge_request(flow, route.served)
    budget = edge_budget(edge, plan, tokenizer)
    if budget is None:
        return None
    headers = await count_call_headers_for(flow.request, gw, flow.target.upstream)
    counted = await provider_counted(gw.provider_counts, gw.session, headers, edge, placed)
    made = settled(plan, edge, budget, counted, flow.note)
    if made is not None:
        flow.provider_counted = True
    return made


async def _held_size(flow: Flow, held: HeldContext, path: tuple[str, ...], headers: Mapping[str, str]) -> int | None:
    """What `GET` at `path` (the provider's, at the host's root) says `held` weighs (Gemini's
    `totalTokenCount` of a cache, kept until it expires)."""
    upstream, gw = flow.target.upstream, flow.gw
    if gw.session is None:
        return None
    url = str(host_root_url(upstream.base_url, path))
    try:
        async with asyncio.timeout(upstream.provider_count_timeout):
            answer = await answered_json(gw.session, "GET", url, None, headers)
    except (TimeoutError, BackendDown):
        return None
    for report in held_of(answer, None):
        if report.kind == "cache" and report.id == held.id:
            kept = (report.kind, report.id, report.tokens)
            await gw.ledger.put(upstream.name, ledger_client(flow), kept, report.expires_at)
            return report.tokens
    return None


async def learned(flow: Flow, reported: Reported) -> None:
    """Keep what a relayed answer says the provider now holds, for this client and upstream."""
    if not reported.held:
        return
    ledger, upstream, client = flow.gw.ledger, flow.target.upstream.name, ledger_client(flow)
    for report in reported.held:
        await ledger.put(upstream, client, (report.kind, report.id, report.tokens), report.expires_at)


async def count_call_headers_for(request: web.Request, gw: Gateway, upstream: UpstreamSettings) -> Mapping[str, str]:
    """The headers of a provider count call: the forwarded request's credential and nothing else."""
    keys = gw.settings.server.client_keys
    try:
        auth = await gw.auths[upstream.name].header(request.headers.get("Authorization"), bool(keys))
    except GuardError:  # no credential now: the call goes without, fails, and the upper bound stands
        auth = None
    return count_call_headers(request.headers, upstream, auth, keys)


def held_refusal(refusal: ContextLengthExceeded, held: int) -> ContextLengthExceeded:
    """The guard's refusal of a request, saying how much of its count the provider holds: what
    the client can do differs, since the held part is not in its body."""
    if held:
        refusal.message += (
            f" Of those, {held:,} are held by the provider (the stored response, conversation or cache the "
            'request names) and cannot be cut: start anew, or send truncation "auto" where the API has it.'
        )
    return refusal


async def counted_with_held(flow: Flow, total: int, exact: bool) -> tuple[int, str]:
    """A count the guard answers itself (Gemini's `:countTokens`) with the cache the request names
    added, as the provider counts it, and what kind of count that is (`COUNT_HEADER`): `exact` or
    `upper-bound` as the sent part's count is, `incomplete` when the cache could not be sized."""
    gw = flow.gw
    if not hasattr(flow, "target"):  # a count endpoint is not routed to be sent: the cache is asked where it would go
        flow.target = gw.router.route(flow.model or "")
    headers = await count_call_headers_for(flow.request, gw, flow.target.upstream)
    held = await looked_up(flow, headers, _inline)
    if held.tokens is None or held.source in ("unknown", "partial"):
        return total + (held.tokens or 0), "incomplete"
    others = [note for note in flow.parsed.notes if not note.startswith("cachedContent")]
    return total + held.tokens, "exact" if exact and not others else "upper-bound"


async def _inline(work: Callable[[], Any]) -> Any:
    return work()


async def count_answer(flow: Flow) -> web.Response:
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
    if parsed.held:  # a cache it names: added as the provider counts it
        total, kind = await counted_with_held(flow, total, fitted.plan.count.exact)
    response = web.json_response(adapter.count_answer(endpoint.answer(total), fitted.original_tokens))
    response.headers["x-request-id"] = flow.request_id
    # The body has no field for it: what kind of count this is (an upper bound where no tokenizer of the model ships).
    response.headers[COUNT_HEADER] = kind
    response.headers[OUTCOME_HEADER] = ANSWERED_LOCALLY
    return response
