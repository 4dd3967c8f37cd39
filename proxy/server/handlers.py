"""Request handlers: a thin I/O loop around the core's decisions.

A guarded request (any API shape an adapter in `proxy.apis` understands) is read, parsed by its
adapter into the chat view the core counts, routed, and handed to
`proxy.core.exchange.Attempts`, which plans (counts and trims for the model that will serve it,
written back into the API's own shape) and decides what to do. This module only performs what it
decides: send the bytes, relay the answer, and feed an upstream's error back so the machine can
correct itself and retry once. Everything the request did is written into its `RequestRecord`,
which the `records` middleware logs and counts when the request ends.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
from collections.abc import Callable, Hashable, Mapping
from typing import Any

from aiohttp import web

from proxy.apis.anthropic import count_tokens_body
from proxy.apis.base import InvalidRequest, Parsed
from proxy.apis.fields import refuse_client_template
from proxy.apis.registry import Endpoint
from proxy.config.trim import MODES, Mode
from proxy.config.upstreams import UpstreamSettings
from proxy.core.budget import BudgetPolicy
from proxy.core.compaction import summary_request, with_summary
from proxy.core.exchange import Attempts, Forward, Reject, Relay
from proxy.core.plan import InvalidBody, Plan
from proxy.core.tokenizer import Tokenizer
from proxy.errors import (
    BadRequest,
    ContextLengthExceeded,
    GuardError,
    HTTPRefusal,
    UpstreamUnavailable,
)
from proxy.server.backends.counting import Choice, near_loop, off_loop
from proxy.server.backends.profiles import budget_policy
from proxy.server.backends.provider_count import EdgeRequest, at_edge, count_call_headers
from proxy.server.client_scope import client_scope
from proxy.server.gateway import GATEWAY, MODE_HEADER, RECORD, Gateway
from proxy.server.paths import PATH_ROUTE
from proxy.server.record import RequestRecord, report_headers
from proxy.server.slots import client_key
from proxy.server.upstream import answers
from proxy.server.upstream.answers import UsageReader, first_event
from proxy.server.upstream.forwarding import buffered, outgoing, probe_overflow, read_body, relay_answer, upstream_call
from proxy.server.upstream.relay import (
    Target,
    decoded,
    read_error_body,
    request_headers,
)
from proxy.server.upstream.streams import ask_for_usage
from proxy.tokenizers.map_corrections import correction_for
from proxy.wire.chat_body import read_chat_body
from proxy.wire.prefix_reader import Match
from proxy.wire.strict_json import UnreadableJson


async def guarded(request: web.Request) -> web.StreamResponse:
    """Every counted API shape: read, parse, route, plan, forward, correct, relay."""
    gw, record = request.app[GATEWAY], request[RECORD]
    endpoint = gw.apis.endpoint_for(request[PATH_ROUTE].path.value)
    assert endpoint is not None, "the canonical-path middleware routed here only paths an adapter counts"
    raw = await read_body(request, gw)
    # What is new in the body is read and counted: a conversation re-sent with a turn is small work.
    match = gw.readers.match(endpoint.adapter, raw)
    size = match.new_bytes
    large = size > gw.settings.server.offload_bytes
    client = client_key(request.headers, request.remote)  # its share of the threads
    if large:
        parsed = await off_loop(_parse, gw, endpoint, raw, match, client=client)
    else:
        parsed = await near_loop(_parse, gw, endpoint, raw, match, size=size, client=client)
    model = parsed.model or ""
    record.model, record.stream = model, parsed.stream or endpoint.stream
    record.unread_fields, record.unseen_parts = parsed.unread, parsed.unseen
    if endpoint.local:  # Anthropic's count_tokens: answered from the same count, never forwarded
        size_or_none = len(raw) if not large else None
        return await _count_tokens(gw, record, endpoint, parsed, model, client, client_scope(request), size_or_none)
    mode = select_mode(request, gw, model)
    target = gw.router.route(model)
    record.mode, record.upstream, record.served_model = mode, target.upstream.name, target.model
    if mode == "enforce" and gw.settings.trim.client_templates == "refuse":
        refuse_client_template(parsed.body)
    if not target.upstream.serves(endpoint.api):
        raise HTTPRefusal(
            f"upstream {target.upstream.name!r} does not serve the {endpoint.api} API", 404, code="api_not_served"
        )
    served = target.model or model
    # The budget follows the model that will serve the request: after a rename, the target's window.
    profile = gw.guard.profile(served)
    record.window_source, record.override = profile.window_source, gw.guard.override_pattern(served)
    record.map_correction = correction_for(profile)
    upstream, session, counting = target.upstream, gw.session, gw.counting
    assert session is not None, "the app's upstream session is opened at startup"
    # What is known already (no Ollama model to ask, no backend tokenizer) is not awaited, and the
    # credential for the guard's own calls is looked up only when a call is to be made.
    service: Mapping[str, str] | None = None
    known, stated = counting.known_window(upstream.name, served)
    if not known:
        service = await _service_headers(gw, upstream)
        stated = await counting.window(session, upstream.name, upstream.base_url, served, service)
    if stated:  # the window the server itself runs the model with (vLLM, llama.cpp, Ollama)
        profile = dataclasses.replace(profile, context_window=stated)
        record.window_source = "backend"
    if profile.tokenizer in gw.guard.tokenizers.loaded:
        local = gw.guard.tokenizer(profile)
    else:  # a vocabulary not loaded yet (about a second) loads off the loop
        local = await asyncio.to_thread(gw.guard.tokenizer, profile)
    choice = counting.local_choice(upstream.name, served, profile, local)
    if choice is None:  # the backend's own tokenizer counts
        service = service if service is not None else await _service_headers(gw, upstream)
        choice = await counting.choose(
            session, upstream.name, upstream.base_url, served, parsed.chat, profile, local, service
        )
    record.count_source = choice.source
    if choice.calibration is not None:
        record.calibration = choice.calibration.factor
    held, correction = gw.corrections.held(upstream.name, served)
    if not held:  # kept elsewhere (Redis)
        correction = await gw.corrections.get(upstream.name, served)
    if correction is not None:
        record.applied_correction, record.window_source = correction, "correction"
    if record.window_source == "fallback":  # neither the config, the map, the server nor a correction knew it
        _note(record, "fallback_window")
    backend = counting.profile_of(upstream.name)
    scope = client_scope(request)  # whose part of the count cache this request reads and fills
    budget = budget_policy(backend, gw.guard.policy.budget, counting.options_for(upstream.name).min_output_tokens)
    planner = functools.partial(_plan, gw, record, endpoint, parsed, served, choice=choice, budget=budget, client=scope)
    attempts = Attempts(
        planner,
        mode,
        known_window=profile.context_window,
        correction=correction,
        self_correct=gw.correction_policy,
        provider=backend.kind if backend.kind != "generic" else None,
        read_whole=parsed.read_whole,
    )
    if large:
        decision = await off_loop(attempts.start, client=client)
    else:
        # Sized by the whole body: a re-sent conversation whose counts left the cache (or are still
        # being made by its twin in flight) is counted whole.
        decision = await near_loop(attempts.start, size=len(raw), client=client)
    if choice.source != "backend" and upstream.provider_count:  # bounds straddling the budget: the upstream counts
        edge = EdgeRequest.of(upstream, served, endpoint.api, parsed.body, parsed.chat, counting.discoveries)
        headers = functools.partial(_count_call_headers, request, gw, upstream)
        decision, decided = await at_edge(
            gw.provider_counts, session, headers, edge, attempts, decision, choice.tokenizer, record.notes
        )
        record.count_source = "provider" if decided else record.count_source
    # Ask a stream for its usage when an estimate can learn from it; the client does not see it.
    learns = endpoint.api == "chat" and choice.source in ("calibrated", "estimate") and backend.usage_in_streams
    while True:
        if choice.counter is not None:  # nothing to count again without the backend's tokenizer
            decision = await _backend_counted(record, attempts, decision, choice, planner, endpoint.api == "chat")
        if gw.summariser is not None:
            decision = await _summarised(gw, endpoint, parsed, attempts, decision)
        record.plan, record.attempts = attempts.plan, attempts.attempt
        if isinstance(decision, Reject):
            record.outcome = "rejected"
            raise ContextLengthExceeded.refused(decision.plan.result, endpoint.api, report_headers(record))
        assert isinstance(decision, Forward)
        record.outcome = _outcome(mode, decision)
        sent = decision.body if decision.body is not None else parsed.body
        with_usage, added = ask_for_usage(sent) if learns and record.stream else (sent, False)
        payload = outgoing(target, model, parsed.body, raw, with_usage if added else decision.body)
        extra = {"x-request-id": record.request_id, **report_headers(record)}
        raw_error = b""
        async with upstream_call(request, gw, record, target, payload) as response:
            if response.status < 400:
                first = await first_event(response, record.stream)
                if first is None or first.kind == "data":
                    reader = UsageReader(response, strip=added)
                    head = first.head if first is not None else b""
                    chunks = reader.relayed(head, response)
                    try:
                        out = await relay_answer(request, gw, record, target, response, extra, chunks)
                    finally:
                        _delivered(record, reader)
                    await _commit(gw, record, attempts, target, served)
                    _learn(gw, record, upstream.name, served, reader, sent, choice, local, parsed, client)
                    if gw.settings.log.content_preview_chars > 0:
                        _previews(gw, record, parsed)
                    return out
                # The status line said 200, then nothing came, or an error: not an answer.
                status, error_body = 502, answers.error_body(first)
                if first.kind == "empty" and backend.empty_stream_on_overflow:
                    _note(record, "empty_stream")
                    status, error_body = await probe_overflow(request, gw, record, target, sent)
            else:
                status, raw_error = response.status, await read_error_body(upstream, response)
                error_body = decoded(raw_error, response.headers.get("Content-Encoding"))
            following = attempts.upstream_failed(status, error_body, payload)
            record.learned_correction = attempts.learned
            record.correction_note = attempts.ignored_overflow
            if isinstance(following, (Forward, Reject)):  # the retry is planned for the corrected window
                record.window_source = "correction"
                if "fallback_window" in record.notes:
                    record.notes.remove("fallback_window")
            if isinstance(following, Relay):
                if response.status < 400:  # an empty or error stream the guard cannot fix
                    raise UpstreamUnavailable(f"upstream {upstream.name!r}: {json_message(error_body)}")
                return buffered(response, raw_error, extra)
        decision = following


BACKEND_ROUNDS = 3  # fetches of what a trim produced; one is usually enough


async def _backend_counted(
    record: RequestRecord,
    attempts: Attempts,
    decision: Forward | Reject,
    choice: Choice,
    replan: Callable[[int | None], Plan],
    chat: bool,
) -> Forward | Reject:
    """With the backend's tokenizer, what the trim produced (a shortened message, its marker, a
    note) is counted by the backend too. The body to send is then counted again: within the
    budget, that exact count stands (the cut was made on estimates of the shortened text);
    over it, the decision is re-made with the new counts. The shortening tries new pieces of text
    each time, so this need not converge: the last plan counts what the backend has not counted
    by an upper bound (its bytes). If the backend's count of that plan is still over the budget
    (a cut made by estimated token positions), the cut request goes out with that count and the
    note `backend_count_over_budget`; the window's margin and, past it, self-correction take it
    from there.
    A count reported is never under the backend's."""
    for round_ in range(BACKEND_ROUNDS + 1):
        plan = decision.plan
        if plan is None or not await choice.complete():
            break
        if "estimate" in record.notes:  # said again below, or by the re-made plan, when still true
            record.notes.remove("estimate")
        recounted = choice.recount(plan.result.body) if chat else None
        if recounted is not None and recounted <= plan.result.budget.input_budget:
            if not plan.count.exact:
                _note(record, "estimate")
            exact = dataclasses.replace(plan.result, tokens_after=recounted)
            return attempts.revised(dataclasses.replace(plan, result=exact))
        if round_ == BACKEND_ROUNDS:
            if recounted is not None:  # the backend's own count, over the budget: said, not hidden
                _note(record, "backend_count_over_budget")
                over = dataclasses.replace(plan.result, tokens_after=recounted)
                return attempts.revised(dataclasses.replace(plan, result=over))
            break
        if round_ == BACKEND_ROUNDS - 1:
            choice.bound_unfetched()
        decision = attempts.revised(replan(plan.result.budget.context_window))
    return decision


async def _summarised(
    gw: Gateway, endpoint: Endpoint, parsed: Parsed, attempts: Attempts, decision: Forward | Reject
) -> Forward | Reject:
    """With `trim.summarize_dropped`, the decision re-made with a summary of what was dropped in its
    place (produced by the summariser, or reused from its cache); as it was when there is none."""
    plan = decision.plan if isinstance(decision, Forward) and decision.body is not None else None
    adapter = endpoint.adapter
    if gw.summariser is None or plan is None or plan.counter is None or not adapter.writes_inserted:
        return decision  # summaries only replace what an enforced cut dropped, in a shape that can hold them
    view = plan.view if plan.view is not None else plan.result
    request = summary_request(parsed.chat, view)
    if request is None:
        return decision
    upstream = gw.settings.upstreams[gw.summariser.upstream]
    auth = await gw.auths[upstream.name].header(None, False)
    outcome = await gw.summariser.summarise(request, dict(request_headers({}, upstream, auth)))
    view = with_summary(view, request, outcome.text, outcome.status, plan.counter)
    body = adapter.render(parsed, view.body, view.removals, view.inserted)  # in the API's own shape
    return attempts.revised(dataclasses.replace(plan, result=dataclasses.replace(view, body=body), view=view))


async def _count_call_headers(request: web.Request, gw: Gateway, upstream: UpstreamSettings) -> Mapping[str, str]:
    """The headers of a provider count call: the forwarded request's credential and nothing else."""
    keys = gw.settings.server.client_keys
    try:
        auth = await gw.auths[upstream.name].header(request.headers.get("Authorization"), bool(keys))
    except GuardError:  # no credential now: the call goes without, fails, and the upper bound stands
        auth = None
    return count_call_headers(request.headers, upstream, auth, keys)


async def _service_headers(gw: Gateway, upstream: UpstreamSettings) -> Mapping[str, str]:
    """The headers the guard's own calls to an upstream carry (tokenize, window): its credential."""
    try:
        auth = await gw.auths[upstream.name].header(None, False)
    except GuardError:  # a token that cannot be had now: the calls go without it, and fall back
        auth = None
    return gw.service_headers(upstream, auth)


def _learn(
    gw: Gateway,
    record: RequestRecord,
    upstream: str,
    model: str,
    reader: UsageReader,
    sent: Mapping[str, Any],
    choice: Choice,
    local: Tokenizer,
    parsed: Parsed,
    client: Hashable,
) -> None:
    """An estimate learns from the prompt tokens the upstream reports (chat completions), when
    everything the upstream may have put in the prompt was counted: a field the guard does not
    read (vLLM's `documents`) would otherwise teach every other request its size."""
    usage = reader.usage
    if usage is None or parsed.api != "chat" or record.client_disconnected or record.stream_broken:
        return
    record.provider_prompt_tokens = usage.prompt_tokens
    if not parsed.read_whole:
        return
    cache = gw.guard.count_cache(client)
    learned = gw.counting.observe(upstream, model, usage.prompt_tokens, sent, choice, local, cache)
    if learned is not None:
        record.calibration = learned.factor


def json_message(body: bytes) -> str:
    """The message of an OpenAI-shaped error body, for the guard's own error saying what came."""
    try:
        error = json.loads(body).get("error") or {}
    except (ValueError, AttributeError):
        return "an answer the guard cannot read"
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else "an answer the guard cannot read"


def _parse(gw: Gateway, endpoint: Endpoint, raw: bytes, match: Match | None = None) -> Parsed:
    """The body read strictly (duplicate keys, depth, encoding) and parsed by its API's adapter
    (the chat adapter type-checks every field the core reads); a conversation re-sent with a new
    turn is read and checked only where it is new."""
    try:
        reading = gw.readers.read(endpoint.adapter, raw, match)
        parsed = endpoint.parse(reading.value, reading.known, raw)
    except UnreadableJson as exc:
        raise BadRequest(str(exc), param=exc.key) from None
    except InvalidRequest as exc:
        raise BadRequest(str(exc), param=exc.param) from None
    gw.readers.accepted(endpoint.adapter, reading)
    return parsed


def _plan(
    gw: Gateway,
    record: RequestRecord,
    endpoint: Endpoint,
    parsed: Parsed,
    model: str,
    window: int | None,
    choice: Choice | None = None,
    budget: BudgetPolicy | None = None,
    client: Hashable | None = None,
) -> Plan:
    """Count and trim for `window` with the tokenizer `choice` names (the backend's own, the
    model's, or a calibrated estimate) and the upstream's `budget` policy; the plan's body is
    written back in the API's own shape."""
    counting = (choice.profile, choice.tokenizer) if choice is not None else None
    fitted = gw.guard.fit(endpoint.adapter, parsed, model, window, counting, budget, client)
    if not fitted.exact or (choice is not None and not choice.tokenizer.exact):  # the trim's texts too
        _note(record, "estimate")
    if parsed.server_state:
        _note(record, "server_state")
    plan = fitted.plan
    result = plan.result if fitted.body is plan.result.body else dataclasses.replace(plan.result, body=fitted.body)
    return dataclasses.replace(plan, result=result, view=plan.result)


async def _count_tokens(
    gw: Gateway,
    record: RequestRecord,
    endpoint: Endpoint,
    parsed: Parsed,
    model: str,
    client: str,
    scope: Hashable,
    size: int | None,
) -> web.Response:
    """Anthropic's count_tokens, counted where a request is planned (`size`: new bytes, None for a
    large body; `client`: its share of the threads; `scope`: its part of the count cache)."""
    fit = functools.partial(gw.guard.fit, endpoint.adapter, parsed, model, None, client=scope)
    fitted = await (off_loop(fit, client=client) if size is None else near_loop(fit, size=size, client=client))
    record.plan, record.outcome = fitted.plan, "counted"
    response = web.json_response(count_tokens_body(fitted.plan.count.total))
    response.headers["x-request-id"] = record.request_id
    return response


def _outcome(mode: Mode, decision: Forward) -> str:
    if decision.plan is None:
        return "forwarded"
    outcome = decision.plan.result.outcome
    return outcome if mode == "enforce" else f"dry_run_{outcome}"


async def _commit(gw: Gateway, record: RequestRecord, attempts: Attempts, target: Target, served: str) -> None:
    """A retry the upstream accepted: its correction is now trusted, for this upstream and model."""
    learned = attempts.succeeded()
    if learned is not None and not record.client_disconnected and not record.stream_broken:
        kept = await gw.corrections.remember(target.upstream.name, served, learned)
        gw.metrics.corrected_window.labels(target.upstream.name, gw.guard.model_label(served)).set(kept.window)


def _previews(gw: Gateway, record: RequestRecord, parsed: Parsed) -> None:
    """With `log.content_preview_chars` set, the start of each removed message (operator opt-in)."""
    chars = gw.settings.log.content_preview_chars
    messages = parsed.messages
    for removal in record.removals if chars > 0 else ():
        if removal.index is not None and removal.index < len(messages):
            record.previews[removal.index] = _message_text(messages[removal.index])[:chars]


def _message_text(message: object) -> str:
    content = message.get("content") if isinstance(message, Mapping) else None
    if isinstance(content, list):
        return " ".join(p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else ""


def _delivered(record: RequestRecord, reader: UsageReader) -> None:
    """A client that had the whole answer (a stream's [DONE]) and then left was answered."""
    if reader.delivered:
        record.delivered, record.client_disconnected = True, False


def _note(record: RequestRecord, note: str) -> None:
    if note not in record.notes:
        record.notes.append(note)


async def metrics(request: web.Request) -> web.Response:
    body = request.app[GATEWAY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


def parse_chat(raw: bytes) -> dict[str, Any]:
    """A chat-completions body read as the guard reads it (for the echo upstream and tools)."""
    try:
        return read_chat_body(raw)
    except InvalidBody as exc:
        raise BadRequest(str(exc), param=exc.param) from None


def select_mode(request: web.Request, gw: Gateway, model: str) -> Mode:
    if gw.settings.server.allow_mode_header and (value := request.headers.get(MODE_HEADER)):
        if value not in MODES:
            raise BadRequest(f"{MODE_HEADER} must be one of {', '.join(MODES)}", param=MODE_HEADER)
        return value  # type: ignore[return-value,unused-ignore]  # checked against MODES above
    return gw.guard.mode_for(model)
