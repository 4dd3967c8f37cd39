"""One request, in one object (a flow, in mitmproxy's sense): what it is and what happened to it.

The `records` middleware opens a `Flow` for every request that reaches the app, with its request
id; the flow is the request's record (`proxy.server.observation.record.RequestRecord`): the log
line, the metrics, the `x-context-guard-*` headers and the recent-decisions page read it. Each step
writes what it works out on the flow (`proxy.server.request.perform`): `guarded` the client, its
scope and the parsed body; `prepared` the upstream target, the mode and the exchange; `Performer`
the model's route, the tokenizer's choice, the outcome and what it noted; the upstream call its
status, time and what the relay saw; the answer's usage, from which an estimate learns (`learn`).
What the core's `Exchange` decided (the window and where it came from, a correction applied or
learned, what the provider holds, the plan that was sent) is read off it once, when the request
closes (`Flow.close`), so that nothing is copied from one holder to another while the request runs.

A request id is made without a system call: `secrets.token_hex(16)` asks the kernel for 16 random
bytes on every request (a `getrandom` call), while an id needs to be unique, not secret. 64 random
bits drawn once per process (again in a forked child, whose counter would otherwise repeat its
parent's) name the process among every worker and replica, and a counter names the request within
it. The id is written as a UUID version 4 in 32 hex digits, so that an upstream that accepts only
UUIDs (llama-cpp-python answers any other `x-request-id` with a 400 and an empty body) takes it.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Hashable, Mapping
from typing import Any

from aiohttp import web

from proxy.apis.base import Parsed
from proxy.apis.registry import Endpoint
from proxy.core.exchange import Exchange
from proxy.core.record_fields import field_dict
from proxy.server.backends.catalogue import Choice
from proxy.server.backends.models import ModelRoute, Target
from proxy.server.observation.recent import removed_tool_names
from proxy.server.observation.record import RequestRecord
from proxy.server.request.gateway import Gateway
from proxy.server.upstream.usage import Usage


class Flow(RequestRecord):
    """One request: its record's fields (what the operator reads), and the live pieces the steps
    work with. `endpoint` and `parsed` are set once a guarded request's body is parsed, `target`
    once it is routed; nothing reads them before."""

    __slots__ = (
        "choice",
        "client",
        "endpoint",
        "exchange",
        "gw",
        "large",
        "parsed",
        "provider_counted",
        "raw",
        "request",
        "route",
        "scope",
        "target",
        "usage",
    )
    target: Target  # the upstream it is sent to
    endpoint: Endpoint  # the API adapter its path names
    parsed: Parsed  # its body as the adapter parsed it

    def __init__(self, request: web.Request, gw: Gateway, request_id: str) -> None:
        super().__init__(request_id, request.method, request.path)
        self.request, self.gw = request, gw
        self.client = ""  # its share of the threads and upstream calls (`proxy.server.threads.placement.client_key`)
        self.scope: Hashable = None  # its part of the count cache (`proxy.server.threads.placement`)
        self.raw = b""  # its body, decoded, as received
        self.large = False  # over `server.offload_bytes` of new bytes: its work goes to the large-body threads
        self.route: ModelRoute | None = None  # what its model is counted and sent with
        self.choice: Choice | None = None  # the tokenizer it is counted with, and how it was chosen
        self.exchange: Exchange | None = None  # its state machine, once prepared
        self.provider_counted = False  # the upstream's own count decided its plan
        self.usage: Usage | None = None  # what the upstream's answer said it counted

    def close(self, status: int) -> None:
        """The record finished with `status`: what the steps left on the live pieces (the route,
        the choice, the exchange) read once; a step the request never reached (refused before its
        body was parsed, before its route) leaves its fields as they are."""
        self._read_pieces()
        self.finish(status)

    def _read_pieces(self) -> None:
        try:
            parsed, endpoint = self.parsed, self.endpoint
        except AttributeError:  # not a guarded request, or refused before its body was parsed
            pass
        else:
            self.stream = parsed.stream or endpoint.stream
            self.unread_fields, self.unseen_parts = parsed.unread, parsed.unseen
        try:
            target = self.target
        except AttributeError:  # never routed
            return
        self.upstream = target.upstream.name
        if self.mode is None:  # a pass-through: routed, never counted
            return
        self.served_model = target.model
        route, choice, exchange = self.route, self.choice, self.exchange
        if route is None or exchange is None:  # refused before its model's route was worked out
            return
        self.window_source, self.override, self.map_correction = (
            exchange.window_source,
            route.override,
            route.map_correction,
        )
        if choice is None:
            return
        self.count_source = "provider" if self.provider_counted else choice.source
        if self.calibration is None and choice.calibration is not None:  # none learned from its usage
            self.calibration = choice.calibration.factor
        usage = self.usage
        if usage is not None:  # what the upstream's usage said it counted, beside the guard's count
            self.provider_prompt_tokens, self.provider_cached_tokens = usage.prompt_tokens, usage.cached_tokens
            self.provider_output_tokens = usage.completion_tokens
        self._read_exchange(exchange)

    def _read_exchange(self, exchange: Exchange) -> None:
        if exchange.held is not None:  # what the provider holds for it, and where that came from
            self.held_tokens, self.held_source = exchange.held_tokens, exchange.held.source
        overflow = exchange.overflow
        if overflow is not None:  # the upstream said the context was exceeded (with or without numbers)
            self.upstream_overflow = {k: v for k, v in field_dict(overflow).items() if v is not None}
        if exchange.applied is not None:
            self.applied_correction = exchange.applied
        self.plan, self.attempts = exchange.plan, exchange.attempt
        if exchange.plan is not None and exchange.plan.result.removals:  # names only, for the page's runs
            self.removed_tools = removed_tool_names(self.parsed.messages, exchange.plan.result.removals)
        self.learned_correction, self.correction_note = exchange.learned, exchange.ignored_overflow
        if exchange.attempt == 2 and self.window_source != "correction":  # a retry planned for the corrected window
            self.window_source = "correction"
            self.note("fallback_window", present=False)

    def learn(self, usage: Usage | None, sent: Mapping[str, Any]) -> None:
        """The usage the upstream reports is the record's, whatever the API; an estimate learns
        from its prompt tokens (chat completions), when everything the upstream may have put in
        the prompt was counted: a field the guard does not read (vLLM's `documents`) would
        otherwise teach every other request its size."""
        if usage is None:
            return
        self.usage, choice = usage, self.choice
        whole = self.endpoint.adapter.body_is_view and self.parsed.read_whole
        if not whole or self.client_disconnected or self.stream_broken or choice is None or choice.learning is None:
            return  # only an estimate learns (`Choice.learning`), and from a request counted whole
        gw = self.gw
        learned = gw.backends.observe(choice, usage.prompt_tokens, sent, gw.models.count_cache(self.scope))
        if learned is not None:
            self.calibration = learned.factor  # the estimate's factor its usage taught

    def keep_previews(self, chars: int) -> None:
        """With `log.content_preview_chars` set, the start of each message the sent plan removed
        (operator opt-in)."""
        exchange, messages = self.exchange, self.parsed.messages
        plan = exchange.plan if exchange is not None else None
        for removal in plan.result.removals if plan is not None else ():
            if removal.index is not None and removal.index < len(messages):
                self.previews[removal.index] = _message_text(messages[removal.index])[:chars]


def _message_text(message: object) -> str:
    content = message.get("content") if isinstance(message, Mapping) else None
    if isinstance(content, list):
        return " ".join(p["text"] for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return content if isinstance(content, str) else ""


FLOW = web.RequestKey("flow", Flow)  # opened for every request by the records middleware

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


def request_id_of(given: str | None) -> str:
    """The client's request id when it is at most 128 printable ASCII characters without spaces;
    else a fresh one (a log line or response header must never carry what a client smuggled in)."""
    if given and len(given) <= 128 and given.isascii() and given.isprintable() and " " not in given:
        return given
    return new_request_id()
