"""The request's record from its opening to its close: the id it is opened with, and what its
flow worked out written into it, in one place.

The `records` middleware opens the record with a fresh request id (`new_request_id`), made without
a system call: `secrets.token_hex(16)` asks the kernel for 16 random bytes on every request (a
`getrandom` call), while an id needs to be unique, not secret. 64 random bits drawn once per process
(again in a forked child, whose counter would otherwise repeat its parent's) name the process among
every worker and replica, and a counter names the request within it. The id is written as a UUID
version 4 in 32 hex digits, the form the proxy has always used, so that an upstream that accepts
only UUIDs (llama-cpp-python answers any other `x-request-id` with a 400 and an empty body) takes
it as it is.

The steps of a request put what they worked out on its `Flow` (the model the client named, the
mode, the route, the tokenizer's choice, the exchange with the window it decided and a correction
applied, and the outcome it reached); `fill` copies that into the `RequestRecord` once, when the
`records` middleware closes it, so that the log line, the metrics and the page read one finished
record; so do the upstream call's status and time and what the relay saw (a broken stream, a client
gone, the whole answer delivered), the upstream's usage beside the guard's count, what the provider
holds for the request and an overflow the upstream answered. What the edge opens the record with
(id, method, path, kind), the error the middleware answered with, the notes and the opt-in
previews are written where they happen."""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.core.plan import Plan
from proxy.core.record_fields import field_dict
from proxy.server.observation.recent import removed_tool_names
from proxy.server.observation.record import RequestRecord, note
from proxy.server.request.flow import Flow

# A UUID's version (4) sits in bits 12-15 of its high 64, its variant (RFC 4122: binary 10) in
# the top two of its low 64: the prefix is the high half, the counter takes the other 62 bits, so
# it wraps only after 4.6e18 requests of one process.
_COUNTER_BITS = (1 << 62) - 1
_VARIANT = 0b10 << 62


class RequestIds:
    """A source of ids unique across processes: `next()` is a counter step and one format."""

    def __init__(self) -> None:
        self._reseed()

    def _reseed(self) -> None:
        high = int.from_bytes(os.urandom(8), "big") & ~(0xF << 12) | (4 << 12)
        self._head = f"{high:016x}"
        self._counter = itertools.count(1)

    def next(self) -> str:
        return self._head + format(next(self._counter) & _COUNTER_BITS | _VARIANT, "016x")


REQUEST_IDS = RequestIds()
os.register_at_fork(after_in_child=REQUEST_IDS._reseed)
# A fresh id: 32 hex digits, a UUID version 4, never one this or another process gave. The bound
# method itself, not a function calling it: one call per request.
new_request_id = REQUEST_IDS.next


def fill(record: RequestRecord, flow: Flow) -> None:
    """`record` filled from what `flow`'s steps worked out; a step the request never reached
    (refused before its body was parsed, before its route) leaves its fields as they are."""
    record.model = flow.model
    record.upstream_status, record.upstream_ms = flow.upstream_status, flow.upstream_ms
    record.stream_broken, record.delivered = flow.stream_broken, flow.delivered
    if flow.client_gone:  # while its answer was relayed (the middleware records a client gone otherwise)
        record.client_disconnected = True
    try:
        parsed, endpoint = flow.parsed, flow.endpoint
    except AttributeError:  # not a guarded request, or refused before its body was parsed
        pass
    else:
        record.stream = parsed.stream or endpoint.stream
        record.unread_fields, record.unseen_parts = parsed.unread, parsed.unseen
    if flow.outcome is not None:
        record.outcome = flow.outcome
    if flow.plan is not None:  # counted outside an exchange (a count endpoint)
        record.plan = flow.plan
    try:
        target = flow.target
    except AttributeError:  # never routed
        return
    record.upstream = target.upstream.name
    if flow.mode is None:  # a pass-through: routed, never counted
        return
    record.mode, record.served_model = flow.mode, target.model
    route, choice, exchange = flow.route, flow.choice, flow.exchange
    if route is None or exchange is None:  # refused before its model's route was worked out
        return
    record.window_source, record.override, record.map_correction = (
        exchange.window_source,
        route.override,
        route.map_correction,
    )
    if choice is None:
        return
    record.count_source = "provider" if flow.provider_counted else choice.source
    if choice.calibration is not None:
        record.calibration = choice.calibration.factor
    if flow.calibration is not None:  # learned from this request's usage
        record.calibration = flow.calibration
    usage = flow.usage
    if usage is not None:  # what the upstream's usage said it counted, beside the guard's count
        record.provider_prompt_tokens, record.provider_cached_tokens = usage.prompt_tokens, usage.cached_tokens
        record.provider_output_tokens = usage.completion_tokens
    if exchange.held is not None:  # what the provider holds for it, and where that came from
        record.held_tokens, record.held_source = exchange.held_tokens, exchange.held.source
    overflow = exchange.overflow
    if overflow is not None:  # the upstream said the context was exceeded (with or without numbers)
        record.upstream_overflow = {k: v for k, v in field_dict(overflow).items() if v is not None}
    if exchange.applied is not None:
        record.applied_correction = exchange.applied
    record.plan, record.attempts = exchange.plan, exchange.attempt
    if exchange.plan is not None and exchange.plan.result.removals:  # names only, for the page's runs
        record.removed_tools = removed_tool_names(flow.parsed.messages, exchange.plan.result.removals)
    record.learned_correction, record.correction_note = exchange.learned, exchange.ignored_overflow
    if exchange.attempt == 2 and record.window_source != "correction":  # a retry planned for the corrected window
        record.window_source = "correction"
        note(record, "fallback_window", present=False)


def previews(record: RequestRecord, plan: Plan | None, messages: Sequence[Any], chars: int) -> None:
    """With `log.content_preview_chars` set, the start of each message `plan` removed (operator opt-in)."""
    for removal in plan.result.removals if plan is not None else ():
        if removal.index is not None and removal.index < len(messages):
            record.previews[removal.index] = _message_text(messages[removal.index])[:chars]


def _message_text(message: object) -> str:
    content = message.get("content") if isinstance(message, Mapping) else None
    if isinstance(content, list):
        return " ".join(p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else ""
