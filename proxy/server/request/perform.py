"""What the exchange asks, performed: one guarded request's I/O, one method per command.

`proxy.core.exchange.Exchange` decides (plan, recount, summarise, send, correct, re-plan) and
yields commands; `Performer.perform(command)` does each one for this request (the guard, the
adapter, the backend's tokenizer, the summariser, the upstream) and answers it, keeping what it
learns on the request's `Flow` (the record is filled from it when the request ends).
`prepared()` works out, once, what the exchange needs: the mode, the route, the window, the
tokenizer to count with and any correction learned earlier.

How a command's work runs, inline on the loop, in the medium-body threads or in the large-body
threads, each within the client's fair share of them, is decided in one place: `performed()`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from aiohttp import web

from proxy.apis.fields import refuse_client_template
from proxy.config.budget_and_trim import Mode
from proxy.config.upstreams import UpstreamSettings
from proxy.core.exchange import (
    DELIVERED,
    DELIVERED_IN_PART,
    Answered,
    Command,
    Delivered,
    Exchange,
    Note,
    PlanFor,
    ProviderCount,
    Recount,
    Recounted,
    Reject,
    Relay,
    Remember,
    Render,
    Reply,
    Send,
    Summarise,
    Summary,
)
from proxy.core.models.opt_in_windows import opted_in
from proxy.core.plan import Plan
from proxy.errors import ContextLengthExceeded, GuardError, HTTPRefusal, UpstreamUnavailable
from proxy.server.backends.catalogue import Choice
from proxy.server.backends.model_route import ModelRoute, model_route
from proxy.server.backends.provider_count import EdgeRequest, at_edge, count_call_headers
from proxy.server.observation.record import note, report_headers
from proxy.server.request.flow import Flow
from proxy.server.request.gateway import Gateway
from proxy.server.threads.placement import performed, planned
from proxy.server.upstream import answers
from proxy.server.upstream.answers import UsageReader, first_event
from proxy.server.upstream.forwarding import buffered, outgoing, probe_overflow, relay_answer, upstream_call
from proxy.server.upstream.headers import request_headers
from proxy.server.upstream.routing import Target
from proxy.server.upstream.streams import ask_for_usage
from proxy.server.upstream.upstream_errors import decoded, read_error_body

T = TypeVar("T")


class Performer:
    """One guarded request's I/O. `response` is what to answer once the exchange is over."""

    def __init__(self, flow: Flow, route: ModelRoute, choice: Choice) -> None:
        self.flow, self.request, self.gw, self.record = flow, flow.request, flow.gw, flow.record
        self.endpoint, self.parsed, self.raw, self.large = flow.endpoint, flow.parsed, flow.raw, flow.large
        # Its share of the threads; its part of the count cache (`proxy.server.edge.client_scope`).
        self.client, self.scope, self.target = flow.client, flow.scope, flow.target
        self.served, self.choice, self.budget = route.served, choice, route.budget
        self.backend, self.local = route.backend, route.local
        # Ask a stream for its usage when an estimate can learn from it; the client does not see it.
        self.learns = (
            flow.endpoint.api == "chat"
            and choice.source in ("calibrated", "estimate")
            and route.backend.usage_in_streams
        )
        self.response: web.StreamResponse | None = None
        self._failed: tuple[Any, bytes, bytes, dict[str, str]] | None = None  # the answer a Relay relays

    async def perform(self, command: Command, exchange: Exchange) -> Reply:
        if isinstance(command, PlanFor):
            return await self._performed(self.plan, command.window, command.bound_unfetched)
        if isinstance(command, ProviderCount):
            return await self.provider_count(command)
        if isinstance(command, Recount):
            return await self.recount(command)
        if isinstance(command, Summarise):
            return await self.summarise(command)
        if isinstance(command, Render):
            view = command.view
            return self.endpoint.adapter.render(self.parsed, view.body, view.removals, view.inserted)
        if isinstance(command, Note):
            note(self.record, command.name, command.present)
            return None
        if isinstance(command, Send):
            return await self.send(command)
        if isinstance(command, Remember):
            await self.remember(command)
            return None
        if isinstance(command, Reject):
            self.flow.outcome = "rejected"
            headers = report_headers(exchange.plan, self.flow.mode)
            raise ContextLengthExceeded.refused(command.plan.result, self.endpoint.api, headers)
        assert isinstance(command, Relay), command
        self.relay()
        return None

    async def _performed(self, work: Callable[..., T], *args: Any) -> T:
        """This request's counting work (plans, recounts): sized by the whole body, since a
        re-sent conversation whose counts left the cache (or are still being made by its twin in
        flight) is counted whole: on the loop as long as that stays within the inline budget."""
        return await planned(self.large, work, *args, size=len(self.raw), client=self.client)

    async def _placed(self, work: Callable[[], T]) -> T:
        """Work that grows with the whole body but spends no budget (the edge count call's body):
        on the loop for a body of at most `INLINE_BYTES`, else in the client's share of the threads."""
        return await performed(self.large, work, size=len(self.raw), client=self.client)

    def plan(self, window: int | None, bound_unfetched: bool = False) -> Plan:
        """Count and trim for `window` with the tokenizer the choice names (the backend's own, the
        model's, or a calibrated estimate) and the upstream's budget policy, written back in the
        API's own shape (`Plan.body`)."""
        if bound_unfetched:
            self.choice.bound_unfetched()
        choice, record = self.choice, self.record
        counting = (choice.profile, choice.tokenizer)
        fitted = self.gw.models.fit(
            self.endpoint.adapter, self.parsed, self.served, window, counting, self.budget, self.scope
        )
        if not fitted.exact or not choice.tokenizer.exact:  # the trim's texts too
            note(record, "estimate")
        if self.parsed.server_state:
            note(record, "server_state")
        return fitted.plan

    async def recount(self, command: Recount) -> Recounted | None:
        """The body counted by the backend, once it has counted every text in it (None: it cannot now)."""
        if not await self.choice.complete():
            return None
        if self.endpoint.api != "chat":
            return Recounted(None)
        return Recounted(await self._performed(self.choice.recount, command.body))

    async def provider_count(self, command: ProviderCount) -> Plan | None:
        """The upstream's own count, asked when the plan's bounds straddle its budget
        (`proxy.server.backends.provider_count`); its plan when that count decided (`count_source: provider`)."""
        gw, record, upstream = self.gw, self.record, self.target.upstream
        session = gw.session
        assert session is not None, "the app's upstream session is opened at startup"
        parsed = self.parsed
        edge = EdgeRequest.of(
            upstream, self.served, self.endpoint.api, parsed.body, parsed.chat, gw.backends.discoveries
        )
        headers = functools.partial(_count_call_headers, self.request, gw, upstream)
        counted = await at_edge(
            gw.provider_counts, session, headers, edge, command.plan, self.choice.tokenizer, record.notes, self._placed
        )
        if counted is not None:
            self.flow.provider_counted = True
        return counted

    async def summarise(self, command: Summarise) -> Summary:
        summariser = self.gw.summariser
        assert summariser is not None, "the exchange asks for summaries only when a summariser is set"
        upstream = self.gw.settings.upstreams[summariser.upstream]
        auth = await self.gw.auths[upstream.name].header(None, False)
        outcome = await summariser.summarise(command.request, dict(request_headers({}, upstream, auth)))
        return Summary(outcome.text, outcome.status)

    async def send(self, command: Send) -> Delivered | Answered:
        """Forward, and relay the answer when it is one; else say what came back, for a correction."""
        gw, record, target, parsed, flow = self.gw, self.record, self.target, self.parsed, self.flow
        flow.outcome = command.outcome
        stream = parsed.stream or self.endpoint.stream
        sent = command.body if command.body is not None else parsed.body
        with_usage, added = ask_for_usage(sent) if self.learns and stream else (sent, False)
        payload = outgoing(target, parsed.model or "", parsed.body, self.raw, with_usage if added else command.body)
        exchange = flow.exchange
        assert exchange is not None, "a send is an exchange's command"
        extra = {"x-request-id": record.request_id, **report_headers(exchange.plan, flow.mode)}
        raw_error = b""
        async with upstream_call(self.flow, payload) as response:
            if response.status < 400:
                first = await first_event(response, stream)
                if first is None or first.kind == "data":
                    reader = UsageReader(response, strip=added)
                    chunks = reader.relayed(first.head if first is not None else b"", response)
                    try:
                        self.response = await relay_answer(self.flow, response, extra, chunks)
                    finally:
                        if reader.delivered:  # a client that had the whole answer (a stream's [DONE]) and then left
                            flow.delivered, flow.client_gone = True, False
                    self._learn(reader, sent)
                    if gw.settings.log.content_preview_chars > 0:
                        self._previews(exchange.plan)
                    return DELIVERED_IN_PART if flow.client_gone or flow.stream_broken else DELIVERED
                # The status line said 200, then nothing came, or an error: not an answer.
                status, error_body = 502, answers.error_body(first)
                if first.kind == "empty" and self.backend.empty_stream_on_overflow:
                    note(record, "empty_stream")
                    status, error_body = await probe_overflow(self.flow, sent)
            else:
                status, raw_error = response.status, await read_error_body(target.upstream, response)
                error_body = decoded(raw_error, response.headers.get("Content-Encoding"))
        self._failed = (response, raw_error, error_body, extra)
        return Answered(status, error_body, payload)

    def relay(self) -> None:
        """The upstream's own error, as it came; a 200 with no answer in it is the guard's 502."""
        assert self._failed is not None, "a relay follows an answer that was not accepted"
        response, raw_error, error_body, extra = self._failed
        if response.status < 400:  # an empty or error stream the guard cannot fix
            raise UpstreamUnavailable(f"upstream {self.target.upstream.name!r}: {json_message(error_body)}")
        self.response = buffered(response, raw_error, extra)

    async def remember(self, command: Remember) -> None:
        """A retry the upstream accepted: its correction is now trusted, for this upstream and model."""
        gw, name = self.gw, self.target.upstream.name
        kept = await gw.corrections.remember(name, self.served, command.correction)
        gw.metrics.corrected_window.labels(name, gw.models.model_label(self.served)).set(kept.window)

    def _learn(self, reader: UsageReader, sent: Mapping[str, Any]) -> None:
        """An estimate learns from the prompt tokens the upstream reports (chat completions), when
        everything the upstream may have put in the prompt was counted: a field the guard does not
        read (vLLM's `documents`) would otherwise teach every other request its size."""
        flow, parsed, usage = self.flow, self.parsed, reader.usage
        if usage is None or parsed.api != "chat" or flow.client_gone or flow.stream_broken:
            return
        flow.prompt_tokens = usage.prompt_tokens
        if not parsed.read_whole:
            return
        gw = self.gw
        upstream = self.target.upstream.name
        learned = gw.backends.observe(
            upstream, self.served, usage.prompt_tokens, sent, self.choice, self.local, gw.models.count_cache(self.scope)
        )
        if learned is not None:
            flow.calibration = learned.factor

    def _previews(self, plan: Plan | None) -> None:
        """With `log.content_preview_chars` set, the start of each message `plan` removed (operator opt-in)."""
        chars, record, messages = self.gw.settings.log.content_preview_chars, self.record, self.parsed.messages
        for removal in plan.result.removals if plan is not None else ():
            if removal.index is not None and removal.index < len(messages):
                record.previews[removal.index] = _message_text(messages[removal.index])[:chars]


async def prepared(flow: Flow, mode: Mode) -> tuple[Performer, Exchange]:
    """What the exchange needs, worked out once: the route (kept on the flow), the window the serving
    model runs with, the tokenizer to count with, and a correction learned earlier. What is known
    already (no Ollama model to ask, no backend tokenizer) is not awaited, and the credential for
    the guard's own calls is looked up only when a call is to be made."""
    request, gw, record, endpoint, parsed = flow.request, flow.gw, flow.record, flow.endpoint, flow.parsed
    model = parsed.model or ""
    target = flow.target = gw.router.route(model)
    flow.mode = mode
    if mode == "enforce" and gw.settings.trim.client_templates == "refuse":
        refuse_client_template(parsed.body)
    upstream = target.upstream
    if not upstream.serves(endpoint.api):
        raise HTTPRefusal(
            f"upstream {upstream.name!r} does not serve the {endpoint.api} API", 404, code="api_not_served"
        )
    route = gw.model_routes.get(model, endpoint.api, gw.backends.discoveries)
    if route is None:  # the model's first request, or one that had to ask
        route, asked = await _route_of(gw, model, target)
        if not asked:
            gw.model_routes.put(model, endpoint.api, route)
    served, profile, local, backend = route.served, route.profile, route.local, route.backend
    # A window the request opts into (Anthropic's 1M beta header), where the map gave the model's.
    opted = opted_in(served, request.headers) if route.window_source == "model_map" else None
    larger = opted.context_window if opted is not None and opted.context_window > profile.context_window else None
    flow.route, flow.window_source = route, route.window_source if larger is None else "opt_in"
    choice = route.choice
    if choice is None:  # the backend's own tokenizer counts
        session = gw.session
        assert session is not None, "the app's upstream session is opened at startup"
        headers = await _service_headers(gw, upstream)
        choice = await gw.backends.choose(
            session, upstream.name, upstream.base_url, served, parsed.chat, profile, local, headers
        )
    flow.choice = choice
    held, correction = gw.corrections.held(upstream.name, served)
    if not held:  # kept elsewhere (Redis)
        correction = await gw.corrections.get(upstream.name, served)
    if correction is not None:
        flow.correction, flow.window_source = correction, "correction"
    if flow.window_source == "fallback":  # neither the config, the map, the server nor a correction knew it
        note(record, "fallback_window")
    if route.vocabulary_missing is not None:  # counted with the family's bound (proxy.tokenizers.vocabularies)
        note(record, f"vocabulary_missing:{route.vocabulary_missing}")
    performer = Performer(flow, route, choice)
    summarises = gw.summariser is not None and endpoint.adapter.writes_inserted
    exchange = Exchange(
        mode,
        known_window=larger or profile.context_window,
        window=larger,
        correction=correction,
        self_correct=gw.correction_policy,
        # The provider a correction names: an Anthropic upstream is counted as an OpenAI-like backend.
        provider="anthropic" if upstream.kind == "anthropic" else backend.kind if backend.kind != "generic" else None,
        read_whole=parsed.read_whole,
        recounts=choice.counter is not None,  # nothing to count again without the backend's tokenizer
        chat=parsed.chat if summarises else None,
        # Bounds straddling the budget: the upstream counts (the backend's own tokenizer needs none).
        provider_counts=choice.source != "backend" and upstream.provider_count,
    )
    flow.exchange = exchange
    return performer, exchange


async def _route_of(gw: Gateway, model: str, target: Target) -> tuple[ModelRoute, bool]:
    """`model_route`, after asking the upstream for the served model's window when it was not
    asked yet (with the guard's own credential); and whether anyone was asked (not kept then)."""
    upstream, served = target.upstream, target.model or model
    known, stated = gw.backends.known_window(upstream.name, served)
    if not known:
        session = gw.session
        assert session is not None, "the app's upstream session is opened at startup"
        headers = await _service_headers(gw, upstream)
        stated = await gw.backends.window(session, upstream.name, upstream.base_url, served, headers)
    route, loaded = await model_route(gw.models, gw.backends, model, target, stated)
    return route, loaded or not known


async def _service_headers(gw: Gateway, upstream: UpstreamSettings) -> Mapping[str, str]:
    """The headers the guard's own calls to an upstream carry (tokenize, window): its credential."""
    try:
        auth = await gw.auths[upstream.name].header(None, False)
    except GuardError:  # a token that cannot be had now: the calls go without it, and fall back
        auth = None
    return gw.service_headers(upstream, auth)


def json_message(body: bytes) -> str:
    """The message of an OpenAI-shaped error body, for the guard's own error saying what came."""
    try:
        error = json.loads(body).get("error") or {}
    except (ValueError, AttributeError):
        return "an answer the guard cannot read"
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else "an answer the guard cannot read"


def _message_text(message: object) -> str:
    content = message.get("content") if isinstance(message, Mapping) else None
    if isinstance(content, list):
        return " ".join(p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else ""


async def _count_call_headers(request: web.Request, gw: Gateway, upstream: UpstreamSettings) -> Mapping[str, str]:
    """The headers of a provider count call: the forwarded request's credential and nothing else."""
    keys = gw.settings.server.client_keys
    try:
        auth = await gw.auths[upstream.name].header(request.headers.get("Authorization"), bool(keys))
    except GuardError:  # no credential now: the call goes without, fails, and the upper bound stands
        auth = None
    return count_call_headers(request.headers, upstream, auth, keys)
