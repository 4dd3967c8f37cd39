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
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web
from yarl import URL

from proxy.apis.base import HeldContext, Parsed
from proxy.config.upstreams import UpstreamSettings
from proxy.core.commands import Held
from proxy.errors import ContextLengthExceeded, GuardError
from proxy.server.backends.profiles import BackendDown, answered_json
from proxy.server.backends.provider_count import EdgeRequest, Placed, count_call_headers, provider_counted
from proxy.server.edge.paths import host_root_url
from proxy.server.request.flow import Flow
from proxy.server.request.gateway import Gateway
from proxy.server.upstream.usage import Reported, held_of
from proxy.state.store import client_of

# A cache's name as Google's two APIs write it: `cachedContents/{id}` (Gemini), or under a project.
_CACHE_NAME = re.compile(r"^(?:projects/[\w.-]+/locations/[\w-]+/)?cachedContents/[\w-]{1,128}$")
_VERSION = re.compile(r"^/(v1beta1|v1beta|v1)(?:/|$)")  # the version the base URL's path opens with
_COUNTED_WHOLE = frozenset({"response", "conversation"})  # what OpenAI's input_tokens counts with the request


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
    if upstream.kind == "openai" and any(held.kind in _COUNTED_WHOLE for held in unknown):
        whole = await _whole_count(flow, headers, placed)
        if whole is not None:
            return Held(None, "provider", whole=whole)
    if upstream.kind in ("gemini", "vertex"):
        for held in [h for h in unknown if h.kind == "cache"]:
            tokens = await _cache_size(flow, held, headers)
            if tokens is not None:
                known += tokens
                unknown.remove(held)
        if not unknown:
            return Held(known, "provider")
    return Held(known or None, "partial" if known else "unknown")


async def _whole_count(flow: Flow, headers: Mapping[str, str], placed: Placed) -> int | None:
    """The provider's count of the whole request, held context included (its count endpoint)."""
    gw, route = flow.gw, flow.route
    if route is None or gw.session is None:  # a count endpoint answered locally: no route was worked out
        return None
    edge = EdgeRequest.of(flow.target.upstream, route.served, flow.parsed, gw.backends.discoveries)
    return await provider_counted(gw.provider_counts, gw.session, headers, edge, placed)


async def _cache_size(flow: Flow, held: HeldContext, headers: Mapping[str, str]) -> int | None:
    """A cache's `totalTokenCount` as `GET {version}/{name}` says it (and kept until it expires)."""
    upstream, gw = flow.target.upstream, flow.gw
    if _CACHE_NAME.match(held.id) is None or gw.session is None:
        return None
    stated = _VERSION.match(URL(upstream.base_url).path)
    version = stated.group(1) if stated else ("v1beta" if upstream.kind == "gemini" else "v1")
    segments = (version, *held.id.split("/"))
    url = str(host_root_url(upstream.base_url, segments))
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


# Notes of what the guard now counts after all: held context by id, encrypted reasoning by its bound.
_COUNTED_AFTER_ALL = (
    "previous_response_id:",
    "conversation:",
    "previous_interaction_id",
    "cachedContent:",
    "encrypted reasoning",
)


def count_kind(exact: bool, parsed: Parsed, source: str, held: str | None) -> str:
    """What kind of count a plan's is (`COUNT_HEADER`): `exact`; `upper-bound` (a bound tokenizer,
    a part the adapter bounded, a ciphertext's size: its note says "upper bound"); `estimate` (parts
    estimated, a calibrated estimate, held context sized from the provider's reports in the
    ledger); `incomplete` (what the provider adds is not counted at all). `exact`: the tokenizer's
    count is; `held`: where the held context's size came from."""
    kinds = set()
    for note in parsed.notes:
        if note.startswith(("not counted", "cachedContent")):
            kinds.add("counted" if any(part in note for part in _COUNTED_AFTER_ALL) else "incomplete")
        elif "upper bound" in note:
            kinds.add("upper-bound")
        elif not note.startswith("truncation"):
            kinds.add("estimate")
    if held in ("unknown", "partial") or "incomplete" in kinds:
        return "incomplete"
    # A cache's size is the provider's own count; a chain's, its last answer's input + output.
    chained = held == "ledger" and any(context.kind != "cache" for context in parsed.held)
    if "estimate" in kinds or source in ("calibrated", "estimate") or chained:
        return "estimate"
    return "exact" if exact and "upper-bound" not in kinds else "upper-bound"


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
