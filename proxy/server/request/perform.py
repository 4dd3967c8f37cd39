"""A guarded request performed: read and parsed, then what its exchange asks, one method per command.

A guarded request (any API shape an adapter in `proxy.apis` understands) is read and parsed by
the adapter its route names into the chat view the core counts (`guarded`); `prepared()` checks
what needs no command (the upstream serves the API, a client's template) and opens its exchange.
`proxy.core.exchange.Exchange` then decides (route, tokenizer, correction, plan, recount,
summarise, send, correct, re-plan) and yields commands; `Performer.perform(command)` does each one
for this request (the gateway's route table and backends, the guard, the adapter, the summariser,
the upstream) and answers it, until the exchange is over. What each step works out is kept on the
request's `Flow`, which is its record (the `records` middleware closes, logs and counts it when
the request ends); the `Performer` holds only what its commands pass to each other.

Where a command's work runs (on the loop, or in the client's share of the threads): `proxy.server.threads.placement`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import replace
from typing import Any, TypeVar

from aiohttp import web

from proxy.apis.fields import refuse_client_template
from proxy.apis.fitting import Counting, count_kind
from proxy.config.budget_and_trim import MODES, Mode
from proxy.core.commands import (
    DELIVERED,
    DELIVERED_IN_PART,
    Answered,
    ChooseTokenizer,
    Chosen,
    Command,
    Delivered,
    FindRoute,
    Held,
    LookUpCorrection,
    LookUpHeld,
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
    Routed,
    Send,
    Summarise,
    Summary,
)
from proxy.core.counting.bound import CIPHERTEXT_NOTE
from proxy.core.exchange import Exchange
from proxy.core.learning.corrections import Correction
from proxy.core.models.opt_in_windows import correction_key, opted_in
from proxy.core.plan import BodyError, Plan
from proxy.errors import BadRequest, ContextLengthExceeded, HTTPRefusal
from proxy.server.backends.catalogue import Choice
from proxy.server.backends.models import ModelRoute, chosen_of, counted_with
from proxy.server.edge.body import bad_request, read_body
from proxy.server.edge.credentials import credential_digest
from proxy.server.edge.paths import PATH_ROUTE
from proxy.server.observation.record import count_headers, report_headers
from proxy.server.request.flow import FLOW, Flow
from proxy.server.request.gateway import MODE_HEADER, Gateway
from proxy.server.request.held import (
    count_answer,
    count_call_headers_for,
    held_refusal,
    learned,
    looked_up,
    provider_plan,
)
from proxy.server.threads.placement import client_key, client_scope, performed, planned
from proxy.server.upstream.connection import decoded, read_error_body
from proxy.server.upstream.forwarding import (
    Failed,
    error_relayed,
    outgoing,
    probe_overflow,
    relay_answer,
    upstream_call,
)
from proxy.server.upstream.relay import UsageReader, ask_for_usage, first_event
from proxy.server.upstream.relay import error_body as first_error_body
from proxy.wire.readers import parsed_request
from proxy.wire.top_level_model import named_model

T = TypeVar("T")


async def guarded(request: web.Request) -> web.StreamResponse:
    """Every counted API shape: read, parse, then perform the exchange's commands until it is over."""
    flow, endpoint = request[FLOW], request[PATH_ROUTE].endpoint
    gw = flow.gw
    assert endpoint is not None, "the canonical-path middleware routed here only paths an adapter counts"
    flow.endpoint = endpoint
    digest = credential_digest(request.headers, request.query)  # who the client is, for its share and its counts
    client = flow.client = client_key(digest, request.remote)  # its share of bodies held, threads and upstream calls
    raw = flow.raw = await read_body(request, gw.settings.server.max_body_bytes, client)
    # What is new in the body is read and counted: a conversation re-sent with a turn is small work.
    match = gw.readers.match(endpoint.adapter, raw)
    large = flow.large = match.new_bytes > gw.settings.server.offload_bytes
    try:
        args = (gw.readers, gw.parses, endpoint, raw, match)
        parsed = await performed(large, parsed_request, *args, size=match.new_bytes, client=client)
    except (BodyError, BadRequest) as error:
        flow.model = endpoint.path_model or named_model(raw)  # a refused request's row still names its model
        if isinstance(error, BodyError):  # a body error, whichever layer found it: the client's 400
            raise bad_request(error) from None
        raise
    flow.parsed, model = parsed, parsed.model or ""
    flow.model = model
    flow.scope = client_scope(request, digest)  # whose part of the count cache this request reads and fills
    if endpoint.local:  # Anthropic's count_tokens, Gemini's countTokens: answered from the same count, never forwarded
        return await count_answer(flow)
    performer, exchange = prepared(flow, select_mode(request, gw, model))
    command: Command | None = exchange.start()
    while command is not None:
        command = exchange.send(await performer.perform(command))
    assert performer.response is not None, "an exchange ends with an answer relayed, or raises"
    return performer.response


def select_mode(request: web.Request, gw: Gateway, model: str) -> Mode:
    """The mode the request runs in: its `MODE_HEADER` where the operator allows one, else its model's."""
    if gw.settings.server.allow_mode_header and (value := request.headers.get(MODE_HEADER)):
        if value not in MODES:
            raise BadRequest(f"{MODE_HEADER} must be one of {', '.join(MODES)}", param=MODE_HEADER)
        return value  # type: ignore[return-value,unused-ignore]  # checked against MODES above
    return gw.models.mode_for(model)


class Performer:
    """One guarded request's I/O. `response` is what to answer once the exchange is over; the
    route and the tokenizer's choice are the ones `FindRoute` and `ChooseTokenizer` found."""

    def __init__(self, flow: Flow) -> None:
        self.flow = flow
        self.response: web.StreamResponse | None = None
        self._counted: Counting | None = None  # what the plans count the request as, once chosen
        self._rendered = flow.parsed  # what a plan's view is written into: the request after its context edits
        self._learns = False  # a stream is asked for its usage, to teach an estimate (the client does not see it)
        self._failed: Failed | None = None  # the answer a Relay relays
        self.count_kind = "exact"  # what kind of count the latest plan's is (`COUNT_HEADER`)
        self._learned_as = ""  # the name corrections are kept under (`correction_key`), once routed

    @property
    def route(self) -> ModelRoute:
        """The model's route, as `FindRoute` found it (every later command follows it)."""
        route = self.flow.route
        assert route is not None, "the exchange finds the route first"
        return route

    @property
    def choice(self) -> Choice:
        """The tokenizer's choice, as `FindRoute` or `ChooseTokenizer` made it."""
        choice = self.flow.choice
        assert choice is not None, "the exchange chooses the tokenizer before it plans"
        return choice

    async def perform(self, command: Command) -> Reply:
        return await _PERFORMED[type(command)](self, command)

    async def find_route(self, command: FindRoute) -> Routed:
        """The model's route: kept, else worked out (asking the upstream for the served model's
        window when it was not asked yet); with the window the request opts into by a header
        (Anthropic's 1M beta), which the exchange weighs against the route's."""
        flow, gw, model, api = self.flow, self.flow.gw, self.flow.model or "", self.flow.endpoint.api
        route = gw.model_routes.get(model, api, gw.backends)
        if route is None:  # the model's first request, or one that had to ask
            route, asked = await gw.route_of(model, self.flow.target)
            if not asked:
                gw.model_routes.put(model, api, route)
        flow.route = route
        routed = route.routed
        if route.choice is not None:
            self._chosen(route.choice)
        opt_ins = flow.target.upstream.provider.opt_ins  # most providers honour none: nothing to look for
        opted = opted_in(route.served, flow.request.headers, opt_ins, api) if opt_ins else None
        self._learned_as = route.served if opted is None else correction_key(route.served, opted)  # kept apart
        return routed if opted is None else replace(routed, opt_in_window=opted.context_window)

    async def choose_tokenizer(self, command: ChooseTokenizer) -> Chosen:
        """The backend's own tokenizer when it counts this body, else the model's or an estimate."""
        route, flow = self.route, self.flow
        reach = await flow.gw.reach(flow.target.upstream)
        choice = await flow.gw.backends.choose(reach, route.served, flow.parsed.chat, route.profile, route.local)
        self._chosen(choice)
        return chosen_of(choice)

    async def look_up_correction(self, command: LookUpCorrection) -> Correction | None:
        """A correction learned earlier for the upstream and the served model (Redis when shared)."""
        corrections, name, served = self.flow.gw.corrections, self.flow.target.upstream.name, self._learned_as
        held, correction = corrections.held(name, served)
        return correction if held else await corrections.get(name, served)

    def _chosen(self, choice: Choice) -> None:
        route = self.route
        self.flow.choice = choice
        if choice.note is not None:  # why the backend's own tokenizer did not count it
            self.flow.note(choice.note)
        counted = route.counted
        if counted is None or choice is not route.choice:  # chosen for this request
            counted = counted_with(choice, self.flow.target.upstream, route.served, route.budget)
        self._counted = counted
        self._learns = (
            self.flow.endpoint.adapter.body_is_view
            and choice.source in ("calibrated", "estimate")
            and route.backend.usage_in_streams
        )

    async def plan_for(self, command: PlanFor) -> Plan:
        """The plan for the command's window, where this request's counting work runs (`_performed`)."""
        flow, window, bound = self.flow, command.window, command.bound_unfetched
        return await planned(flow.large, self.plan, window, bound, command.held, size=len(flow.raw), client=flow.client)

    async def look_up_held(self, command: LookUpHeld) -> Held:
        """What the context the provider holds for this request weighs (`proxy.server.request.held`)."""
        headers = await count_call_headers_for(self.flow.request, self.flow.gw, self.flow.target.upstream)
        return await looked_up(self.flow, headers, self._placed)

    async def render(self, command: Render) -> Mapping[str, Any]:
        view = command.view
        return self.flow.endpoint.adapter.render(self._rendered, view.body, view.removals, view.inserted)

    async def note(self, command: Note) -> None:
        self.flow.note(command.name, command.present)

    async def reject(self, command: Reject) -> None:
        self.flow.outcome = "rejected"
        headers = report_headers(command.plan, self.flow.mode) | self._count_headers()
        refusal = ContextLengthExceeded.refused(command.plan.result, self.flow.endpoint.adapter, headers)
        raise held_refusal(refusal, self.flow.exchange.held_tokens if self.flow.exchange is not None else 0)

    async def _performed(self, work: Callable[..., T], *args: Any) -> T:
        """This request's counting work (plans, recounts): sized by the whole body, since a
        re-sent conversation whose counts left the cache (or are still being made by its twin in
        flight) is counted whole: on the loop as long as that stays within the inline budget."""
        return await planned(self.flow.large, work, *args, size=len(self.flow.raw), client=self.flow.client)

    async def _placed(self, work: Callable[[], T]) -> T:
        """Work that grows with the whole body but spends no budget (the edge count call's body):
        on the loop for a body of at most `INLINE_BYTES`, else in the client's share of the threads."""
        return await performed(self.flow.large, work, size=len(self.flow.raw), client=self.flow.client)

    def plan(self, window: int | None, bound_unfetched: bool = False, held: int = 0) -> Plan:
        """Count and trim for `window` with the tokenizer the choice names (the backend's own, the
        model's, or a calibrated estimate) and the upstream's budget policy, written back in the
        API's own shape (`Plan.body`). `held` tokens the provider adds are counted as the API's fixed
        tokens: with the request, never cut. The bound of an encrypted reasoning item is counted with
        the message it precedes (`CIPHERTEXT_TOKENS`), and goes when that goes."""
        choice, record, parsed = self.choice, self.flow, self.flow.parsed
        if bound_unfetched:
            choice.bound_unfetched()
        if any(CIPHERTEXT_NOTE in n for n in parsed.notes):  # the adapter bounded a ciphertext
            record.note("ciphertext_bound")
        if held:
            parsed = replace(parsed, fixed_tokens=parsed.fixed_tokens + held)
        fitted = self.flow.gw.models.fit(self.flow.endpoint.adapter, parsed, window, self._counted, self.flow.scope)
        if not fitted.exact or not choice.tokenizer.exact:  # the trim's texts too
            record.note("estimate")
        held_from = self.flow.exchange.held if self.flow.exchange is not None else None
        exact, source = fitted.plan.count.exact and choice.tokenizer.exact, held_from.source if held_from else None
        self.count_kind = count_kind(exact, parsed, choice.source, source)
        self._rendered = fitted.edited or self.flow.parsed
        if fitted.original_tokens is not None:  # counted as the provider sees it after its context edits
            record.note("context_edits:guard" if record.target.upstream.edits_by_guard else "context_edits:provider")
        if self.flow.parsed.server_state:
            record.note("server_state")
        return fitted.plan

    async def recount(self, command: Recount) -> Recounted | None:
        """The body counted by the backend, once it has counted every text in it (None: it cannot now)."""
        choice = self.choice
        if not await choice.complete():
            return None
        if not self.flow.endpoint.adapter.body_is_view:  # the backend's tokenizer counts chat bodies
            return Recounted(None)
        return Recounted(await self._performed(choice.recount, command.body))

    async def provider_count(self, command: ProviderCount) -> Plan | None:
        """The upstream's own count, asked when the plan's bounds may straddle its budget
        (`proxy.server.request.held.provider_plan`); its plan when that count decided."""
        plan = command.plan
        if not plan.result.removals and plan.count.total <= plan.result.budget.input_budget:
            return None  # its upper bound fits a budget nothing lowered: the bounds cannot straddle it
        return await provider_plan(self.flow, plan, self.choice.tokenizer, self._placed)

    async def summarise(self, command: Summarise) -> Summary:
        return await self.flow.gw.summary(command.request)

    async def send(self, command: Send) -> Delivered | Answered:
        """Forward, and relay the answer when it is one; else say what came back, for a correction."""
        flow = self.flow
        gw, record, target, parsed = flow.gw, flow, flow.target, flow.parsed
        flow.outcome = command.outcome
        stream = parsed.stream or self.flow.endpoint.stream
        sent = command.body if command.body is not None else parsed.body
        with_usage, added = ask_for_usage(sent) if self._learns and stream else (sent, False)
        payload = outgoing(target, parsed.model or "", parsed.body, flow.raw, with_usage if added else command.body)
        exchange = flow.exchange
        assert exchange is not None, "a send is an exchange's command"
        extra = {"x-request-id": record.request_id, **report_headers(exchange.plan, flow.mode)}
        extra |= self._count_headers()
        raw_error = b""
        async with upstream_call(self.flow, payload) as response:
            if response.status < 400:
                content_type = response.headers.get("Content-Type", "")
                framing = self.flow.endpoint.adapter.stream_framing(content_type) if stream else None  # the shape's own
                first = await first_event(response, stream, framing)
                if first is None or first.kind == "data":
                    reader = UsageReader(response, added, framing, self.flow.endpoint.adapter.answer_usage)
                    chunks = reader.relayed(first.head if first is not None else b"", response)
                    try:
                        self.response = await relay_answer(self.flow, response, extra, chunks)
                    finally:
                        if reader.delivered:  # a client that had the whole answer (a stream's [DONE]) and then left
                            flow.delivered, flow.client_disconnected = True, False
                    flow.learn(reader.usage, sent)
                    if reader.reported.held:  # what the provider now holds, kept for later requests
                        await learned(flow, reader.reported)
                    chars = gw.settings.log.content_preview_chars
                    if chars > 0:
                        flow.keep_previews(chars)
                    return DELIVERED_IN_PART if flow.client_disconnected or flow.stream_broken else DELIVERED
                # The status line said 200, then nothing came, or an error: not an answer.
                status, error_body = 502, first_error_body(first)
                if first.kind == "empty" and self.route.backend.empty_stream_on_overflow:
                    record.note("empty_stream")
                    status, error_body = await probe_overflow(self.flow, sent)
            else:
                status, raw_error = response.status, await read_error_body(target.upstream, response)
                error_body = decoded(raw_error, response.headers.get("Content-Encoding"))
        self._failed = (response, raw_error, error_body, extra)
        return Answered(status, error_body, payload)

    async def relay(self, command: Relay) -> None:
        assert self._failed is not None, "a relay follows an answer that was not accepted"
        self.response = error_relayed(self.flow, self._failed)

    async def remember(self, command: Remember) -> None:
        """A retry the upstream accepted: its correction is now trusted, for this upstream and model."""
        gw, name, served = self.flow.gw, self.flow.target.upstream.name, self.route.served
        kept = await gw.corrections.remember(name, self._learned_as, command.correction)
        gw.metrics.corrected_window.labels(name, gw.models.model_label(served)).set(kept.window)

    def _count_headers(self) -> dict[str, str]:
        """What kind of count the guard's is, and the held context it includes (`count_headers`)."""
        exchange = self.flow.exchange
        if exchange is None or exchange.plan is None:  # nothing counted (`mode: off`)
            return {}
        held = exchange.held
        return count_headers(self.count_kind, held.source if held is not None else None, exchange.held_tokens)


def prepared(flow: Flow, mode: Mode) -> tuple[Performer, Exchange]:
    """The exchange opened for `flow` in `mode`, and what performs its commands: routed to its
    upstream (which must serve the API), a client's template refused where the operator says so."""
    gw, endpoint, parsed = flow.gw, flow.endpoint, flow.parsed
    target = flow.target = gw.router.route(flow.model or "")
    flow.mode = mode
    if mode == "enforce" and gw.settings.trim.client_templates == "refuse":
        refuse_client_template(parsed.body)
    upstream = target.upstream
    if endpoint.api not in upstream.served:
        raise HTTPRefusal(
            f"upstream {upstream.name!r} does not serve the {endpoint.api} API", 404, code="api_not_served"
        )
    performer = Performer(flow)
    summarises = gw.summariser is not None and endpoint.adapter.writes_inserted
    exchange = flow.exchange = Exchange(
        mode,
        read_whole=parsed.read_whole,
        chat=parsed.chat if summarises else None,
        self_correct=gw.correction_policy,
        holds=(bool(parsed.held), parsed.body.get("truncation") == "auto"),
    )
    return performer, exchange


_PERFORMED: dict[type, Callable[[Performer, Any], Awaitable[Reply]]] = {
    FindRoute: Performer.find_route,
    ChooseTokenizer: Performer.choose_tokenizer,
    LookUpCorrection: Performer.look_up_correction,
    LookUpHeld: Performer.look_up_held,
    PlanFor: Performer.plan_for,
    ProviderCount: Performer.provider_count,
    Recount: Performer.recount,
    Summarise: Performer.summarise,
    Render: Performer.render,
    Note: Performer.note,
    Send: Performer.send,
    Remember: Performer.remember,
    Reject: Performer.reject,
    Relay: Performer.relay,
}
