"""Asking the upstream's own count endpoint, for a request whose bounds straddle its budget.

`proxy.core.counting.edge` decides whether to ask and what (`edge_budget` applies it to a plan);
this module asks (`provider_counted`), once per request, within the upstream's
`provider_count_timeout`, and keeps the answer (by upstream, model and body digest, `KEPT` of them)
so a request re-sent unchanged is not asked about again; `settled` makes the plan. When the provider's count
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
    lower_bound,
    read_count,
    straddles,
)
from proxy.core.models.model_registry import family_for
from proxy.core.plan import Plan
from proxy.errors import UpstreamUnavailable
from proxy.providers.provider import OutgoingCall
from proxy.server.backends.profiles import BackendDown, Discovery, answered_json
from proxy.server.backends.tokenize_calls import calls_for
from proxy.server.upstream.connection import request_headers
from proxy.wire.codec import dumps

if TYPE_CHECKING:
    from proxy.apis.base import Parsed
    from proxy.config.upstreams import UpstreamSettings
    from proxy.providers.provider import Provider

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


@dataclass(frozen=True, slots=True)
class SerialisedCall:
    """A count call with its body serialised (`data`) and the key its answer is kept under (the
    digest of those bytes: no second serialisation of the body to key it)."""

    call: CountCall
    key: str
    data: bytes


@dataclass
class ProviderCounts:
    """The provider counts asked for, newest last, at most `KEPT`; and how many calls were made."""

    kept: OrderedDict[str, int] = field(default_factory=OrderedDict)
    calls: int = 0

    async def count(
        self,
        session: aiohttp.ClientSession,
        call: SerialisedCall,
        headers: Mapping[str, str],
        timeout: float,
        finish: Finish | None = None,
    ) -> int | None:
        """The count `call` answers (kept or asked for now); None when it fails or is late (`finish`:
        the provider signs the call as it is sent)."""
        key = call.key
        if key in self.kept:
            self.kept.move_to_end(key)
            return self.kept[key]
        self.calls += 1
        sent = dict(headers)
        for name, value in call.call.headers.items():  # what the endpoint requires (Anthropic's version)
            sent.setdefault(name, value)
        url = call.call.url
        try:
            async with asyncio.timeout(timeout):
                if finish is not None:  # signed as sent: its type too
                    finished = await finish(
                        OutgoingCall("POST", url, {**sent, "Content-Type": "application/json"}, call.data)
                    )
                    url, sent = finished.url, dict(finished.headers)
                answer = await answered_json(session, "POST", url, call.data, sent)
        except (TimeoutError, BackendDown, UpstreamUnavailable):  # late, failed, or no credentials to sign with
            return None
        counted = read_count(call.call, answer)
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
    provider: Provider  # what the upstream's kind knows: its count endpoint
    base_url: str
    model: str  # as served
    api: str
    body: Mapping[str, Any]  # as the client sent it, in its API's shape
    chat: Mapping[str, Any]  # the chat view the core counted
    enabled: bool
    timeout: float
    assumed_ratio: float | None
    discovery: Discovery | None
    body_is_view: bool  # the body is the chat view (`Adapter.body_is_view`): a tokenize call counts it
    finish: Finish | None = None  # the provider signs its calls: the count call is signed as it is sent

    @classmethod
    def of(
        cls, upstream: UpstreamSettings, model: str, parsed: Parsed, discoveries: Mapping[str, Discovery], view: bool
    ) -> EdgeRequest:
        """`parsed` as sent to `upstream`'s `model` (as served); `view`: its adapter's `body_is_view`."""
        return cls(
            upstream.name,
            upstream.provider,
            upstream.base_url,
            model,
            parsed.api,
            parsed.body,
            parsed.chat,
            upstream.provider_count,
            upstream.provider_count_timeout,
            upstream.provider_count_ratio,
            discoveries.get(upstream.name),
            view,
        )


@dataclass(frozen=True, slots=True)
class EdgeBudget:
    """The budget the provider's count is held against: the request's as sent (`clamped`: the
    tokens by which the cut had lowered its max_tokens, given back)."""

    input_budget: int
    clamped: int


# Runs work that grows with the body where the request's own counting runs (on the loop for a
# small body, else in the client's share of the threads: `proxy.server.threads.placement.performed`).
Placed = Callable[[Callable[[], Any]], Awaitable[Any]]
# Makes an outgoing call final: a signing provider's signature (`UpstreamAuth.finished`).
Finish = Callable[[OutgoingCall], Awaitable[OutgoingCall]]


def edge_budget(request: EdgeRequest, plan: Plan, tokenizer: object) -> EdgeBudget | None:
    """Whether to ask the provider about `plan` (made from a bound: the exchange offers no exact
    count): the budget its count is held against when the request's bounds straddle it (the lower
    bound fits, the upper does not), else None: `plan` stands."""
    if not request.enabled:
        return None
    # The budget of the request as sent: a max_tokens the cut lowered is the client's again.
    clamped = sum(r.tokens for r in plan.result.removals if r.kind == "max_tokens_clamped")
    upper, budget = plan.count.total, plan.result.budget.input_budget - clamped
    lower = lower_bound(
        upper, False, bound_ratio_of(tokenizer, request.assumed_ratio, _stated_ratio(request.model, tokenizer))
    )
    return EdgeBudget(budget, clamped) if straddles(upper, lower, budget) else None


def settled(
    plan: Plan, request: EdgeRequest, edge: EdgeBudget, counted: int | None, note: Callable[[str], object]
) -> Plan | None:
    """`plan` as the provider's count re-makes it (the request as the client sent it) when that
    count fits `edge`'s budget; else None, saying why by `note` (the request's notes): `plan` stands."""
    if counted is None:
        note("provider_count_failed")
        return None
    if counted > edge.input_budget:
        note("provider_count_over_budget")
        return None
    return _as_sent(plan, request.body, request.chat, counted, edge.clamped)


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


def _serialised(request: EdgeRequest) -> SerialisedCall | None:
    """The count call for `request`, its body serialised, and its cache key (the bytes' digest)."""
    call = request.provider.count_call(request.base_url, request.model, request.api, request.body)
    if call is None:
        return None
    data = dumps(call.body)
    return SerialisedCall(call, bytes_key(request.upstream, request.model, call.url, data), data)


async def provider_counted(
    counts: ProviderCounts,
    session: aiohttp.ClientSession,
    headers: Mapping[str, str],
    request: EdgeRequest,
    placed: Placed,
) -> int | None:
    """The provider's own count of `request` (its count endpoint, or a local server's tokenize
    calls), kept or asked now; None when it cannot be had. The call's body is built, serialised
    and digested (its cache key) by `placed`: never on the loop for a large body."""
    if request.provider.count_endpoint:
        call = await placed(functools.partial(_serialised, request))
        return None if call is None else await counts.count(session, call, headers, request.timeout, request.finish)
    if request.discovery is not None and request.body_is_view:  # vLLM, llama.cpp: their tokenize calls
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
