"""Asking the upstream's own count endpoint, for a request whose bounds straddle its budget.

`proxy.core.counting.edge` decides whether to ask and what; this module asks, once per request, within
the upstream's `provider_count_timeout`, and keeps the answer (by upstream, model and body digest,
`KEPT` of them) so a request re-sent unchanged is not asked about again. When the provider's count
fits the budget, the request goes as the client sent it and the log says the provider's count
decided (`count_source: provider`); when it does not fit, or the endpoint fails or is late, the
cut made on the upper bound stands (notes `provider_count_over_budget`, `provider_count_failed`).

vLLM and llama.cpp need no such call: their tokenize endpoints already count every text of the
request exactly (`proxy.server.backends.tokenize`); where the guard counts locally in front of one
(`tokenize: local`), the same tokenize calls are asked for the rendered conversation.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import aiohttp

from proxy.core.counting.edge import (
    CountCall,
    body_key,
    bound_ratio_of,
    bytes_key,
    count_call,
    lower_bound,
    read_count,
    straddles,
)
from proxy.core.models.model_registry import family_for
from proxy.core.plan import Plan
from proxy.server.backends.profiles import BackendDown, Discovery, answered_json
from proxy.server.backends.tokenize_calls import calls_for
from proxy.server.upstream.headers import request_headers
from proxy.wire.codec import dumps

if TYPE_CHECKING:
    from proxy.config.upstreams import UpstreamSettings

KEPT = 1024  # provider counts remembered per gateway
# What of the forwarded request's headers a count call carries: who asks, and the API's version.
_CREDENTIALS = frozenset(
    (
        "authorization",
        "x-api-key",
        "api-key",
        "anthropic-version",
        "anthropic-beta",
        "openai-organization",
        "openai-project",
        "x-goog-user-project",
        "x-goog-api-key",
    )
)
_KINDS = {"anthropic": "anthropic", "openai": "openai", "vertex": "vertex", "gemini": "gemini"}
_ANTHROPIC_VERSION = "2023-06-01"


@dataclass
class ProviderCounts:
    """The provider counts asked for, newest last, at most `KEPT`; and how many calls were made."""

    kept: OrderedDict[str, int] = field(default_factory=OrderedDict)
    calls: int = 0

    async def count(
        self,
        session: aiohttp.ClientSession,
        call: CountCall,
        key: str,
        headers: Mapping[str, str],
        timeout: float,
        data: bytes | None = None,
    ) -> int | None:
        """The count `call` answers (kept or asked for now); None when it fails or is late.
        `data`: `call.body` serialised already (else it is serialised when sent)."""
        if key in self.kept:
            self.kept.move_to_end(key)
            return self.kept[key]
        self.calls += 1
        sent = dict(headers)
        if call.kind == "anthropic":
            sent.setdefault("anthropic-version", _ANTHROPIC_VERSION)
        try:
            async with asyncio.timeout(timeout):
                answer = await answered_json(session, "POST", call.url, call.body if data is None else data, sent)
        except (TimeoutError, BackendDown):
            return None
        counted = read_count(call, answer)
        if counted is not None:
            self.remember(key, counted)
        return counted

    def remember(self, key: str, counted: int) -> None:
        self.kept[key] = counted
        while len(self.kept) > KEPT:
            self.kept.popitem(last=False)


@dataclass(frozen=True)
class EdgeRequest:
    """What the edge check needs of one request, gathered by the handler."""

    upstream: str
    kind: str  # the upstream's configured kind
    base_url: str
    model: str  # as served
    api: str
    body: Mapping[str, Any]  # as the client sent it, in its API's shape
    chat: Mapping[str, Any]  # the chat view the core counted
    enabled: bool
    timeout: float
    assumed_ratio: float | None
    discovery: Discovery | None

    @classmethod
    def of(
        cls,
        upstream: UpstreamSettings,
        model: str,
        api: str,
        body: Mapping[str, Any],
        chat: Mapping[str, Any],
        discoveries: Mapping[str, Discovery],
    ) -> EdgeRequest:
        return cls(
            upstream.name,
            upstream.kind,
            upstream.base_url,
            model,
            api,
            body,
            chat,
            upstream.provider_count,
            upstream.provider_count_timeout,
            upstream.provider_count_ratio,
            discoveries.get(upstream.name),
        )


# Runs work that grows with the body where the request's own counting runs (on the loop for a
# small body, else in the client's share of the threads: `proxy.server.threads.placement.performed`).
Placed = Callable[[Callable[[], Any]], Awaitable[Any]]


async def _inline(work: Callable[[], Any]) -> Any:
    return work()


async def at_edge(
    counts: ProviderCounts,
    session: aiohttp.ClientSession,
    headers: Callable[[], Awaitable[Mapping[str, str]]],
    request: EdgeRequest,
    plan: Plan,
    tokenizer: object,
    notes: list[str],
    placed: Placed = _inline,
) -> Plan | None:
    """`plan` (made from a bound: the exchange offers no exact count) as the provider's count
    re-makes it, when the request's bounds straddle its budget and the provider's count fits it
    (the exchange's `ProviderCount`); else None: `plan` stands. The call's body is built,
    serialised and digested (its cache key) by `placed`: never on the loop for a large body."""
    if not request.enabled:
        return None
    # The budget of the request as sent: a max_tokens the cut lowered is the client's again.
    clamped = sum(r.tokens for r in plan.result.removals if r.kind == "max_tokens_clamped")
    upper, budget = plan.count.total, plan.result.budget.input_budget - clamped
    lower = lower_bound(
        upper, False, bound_ratio_of(tokenizer, request.assumed_ratio, _stated_ratio(request.model, tokenizer))
    )
    if not straddles(upper, lower, budget):
        return None
    counted = await _provider_count(counts, session, await headers(), request, placed)
    if counted is None:
        notes.append("provider_count_failed")
        return None
    if counted > budget:
        notes.append("provider_count_over_budget")
        return None
    return _as_sent(plan, request.body, request.chat, counted, clamped)


# A model's family, matched once per name (a few dozen patterns; every bound-counted request asks),
# in a bounded table: names are the clients'.
_family_of = functools.lru_cache(maxsize=1024)(family_for)


def _stated_ratio(model: str, tokenizer: object) -> float | None:
    """The ratio the model's family states for its own vocabulary (Gemini counted with Gemma's),
    when that vocabulary is what counted (not an operator's tokenizer, not the bound)."""
    family = _family_of(model)
    if family.tokenizer.kind != "vocab" or getattr(tokenizer, "name", None) != family.tokenizer.source:
        return None
    return family.bound_ratio


def count_call_headers(
    client: Mapping[str, str], upstream: UpstreamSettings, auth: str | None, keys: Iterable[str]
) -> Mapping[str, str]:
    """The headers of the count call: the credential the forwarded request carries to the same
    upstream (`auth`: the upstream's own key, or the client's passing through), its configured
    headers, and nothing else of the client's."""
    headers = request_headers(client, upstream, auth, keys)
    return {k: v for k, v in headers.items() if k.lower() in _CREDENTIALS or k in upstream.headers}


def _prepared(kind: str, request: EdgeRequest) -> tuple[CountCall, str, bytes] | None:
    """The count call for `request`, its body serialised, and its cache key (the bytes' digest)."""
    call = count_call(kind, request.base_url, request.model, request.api, request.body)
    if call is None:
        return None
    data = dumps(call.body)
    return call, bytes_key(request.upstream, request.model, call.url, data), data


async def _provider_count(
    counts: ProviderCounts,
    session: aiohttp.ClientSession,
    headers: Mapping[str, str],
    request: EdgeRequest,
    placed: Placed,
) -> int | None:
    kind = _KINDS.get(request.kind)
    if kind is not None:
        prepared = await placed(functools.partial(_prepared, kind, request))
        if prepared is None:
            return None
        call, key, data = prepared
        return await counts.count(session, call, key, headers, request.timeout, data)
    if request.discovery is not None and request.api == "chat":  # vLLM, llama.cpp: their tokenize calls
        calls = calls_for(request.discovery, session, request.base_url, request.model, headers)
        messages = request.chat.get("messages")
        if calls is None or not isinstance(messages, list) or request.chat.get("tools"):
            return None  # the rendered conversation is asked without tools: a request with them is not
        tokenize, asked = f"{request.base_url}#tokenize", {"messages": messages}
        key = await placed(functools.partial(body_key, request.upstream, request.model, tokenize, asked))
        if key in counts.kept:
            return counts.kept[key]
        counts.calls += 1
        try:
            async with asyncio.timeout(request.timeout):
                counted = await calls.conversation(messages)
        except (TimeoutError, BackendDown):
            return None
        if counted is not None:
            counts.remember(key, counted)
        return counted
    return None


def _as_sent(plan: Plan, body: Mapping[str, Any], chat: Mapping[str, Any], counted: int, clamped: int) -> Plan:
    """The plan for sending the request untouched, counted `counted` tokens by its provider."""
    untouched: dict[str, Any] = {
        "outcome": "unchanged",
        "tokens_before": counted,
        "tokens_after": counted,
        "removals": (),
        "strategies": (),
        "cut": None,
        "note_tokens": 0,
        "summary_room": 0,
        "insert_at": 0,
        "inserted": (),
    }
    budget = plan.result.budget  # with the client's max_tokens again, where the cut had lowered it
    budget = dataclasses.replace(
        budget,
        prompt_tokens=counted,
        output_reserve=budget.output_reserve + clamped,
        input_budget=budget.input_budget - clamped,
    )
    result = dataclasses.replace(plan.result, body=chat, budget=budget, **untouched)  # the chat view
    return dataclasses.replace(plan, result=result, body=body)
