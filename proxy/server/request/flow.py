"""One request's state, in one object (a flow, in mitmproxy's sense).

The `records` middleware opens a `Flow` for every request that reaches the app: the request, the
gateway it is served by (one for the whole request, even across a reload) and its `RequestRecord`.
Each step after it reads what it needs from the flow and adds what it worked out: the handler the
client, its scope and the parsed body; `proxy.server.request.perform.prepared` the upstream target, the
mode and the exchange (which decides the window, where it came from and a correction applied);
`Performer` the model's route, the tokenizer's choice, the outcome, the upstream's usage and what
it taught. The steps take the flow, not the pieces of it one by
one, and the record is written from it in one place (`proxy.server.observation.recording.fill`).
"""

from __future__ import annotations

from collections.abc import Hashable

from aiohttp import web

from proxy.apis.base import Parsed
from proxy.apis.registry import Endpoint
from proxy.config.budget_and_trim import Mode
from proxy.core.exchange import Exchange
from proxy.core.plan import Plan
from proxy.server.backends.catalogue import Choice
from proxy.server.backends.model_route import ModelRoute, Target
from proxy.server.observation.record import RequestRecord
from proxy.server.request.gateway import Gateway
from proxy.server.upstream.usage import Usage


class Flow:
    """One request: what it is, who sent it, where it goes, and its record. `endpoint` and `parsed`
    are set once a guarded request's body is parsed, `target` once it is routed; nothing reads
    them before."""

    __slots__ = (
        "calibration",
        "choice",
        "client",
        "client_gone",
        "delivered",
        "endpoint",
        "exchange",
        "gw",
        "large",
        "mode",
        "model",
        "outcome",
        "parsed",
        "plan",
        "provider_counted",
        "raw",
        "record",
        "request",
        "route",
        "scope",
        "stream_broken",
        "target",
        "upstream_ms",
        "upstream_status",
        "usage",
    )
    target: Target  # the upstream it is sent to
    endpoint: Endpoint  # the API adapter its path names
    parsed: Parsed  # its body as the adapter parsed it

    def __init__(self, request: web.Request, gw: Gateway, record: RequestRecord) -> None:
        self.request, self.gw, self.record = request, gw, record
        self.client = ""  # its share of the threads and upstream calls (`proxy.server.threads.placement.client_key`)
        self.scope: Hashable = None  # its part of the count cache (`proxy.server.threads.placement`)
        self.raw = b""  # its body, decoded, as received
        self.large = False  # over `server.offload_bytes` of new bytes: its work goes to the large-body threads
        self.model: str | None = None  # as the client named it
        self.mode: Mode | None = None  # set once a guarded request is routed
        self.route: ModelRoute | None = None  # what its model is counted and sent with
        self.choice: Choice | None = None  # the tokenizer it is counted with, and how it was chosen
        self.exchange: Exchange | None = None  # its state machine, once prepared
        self.plan: Plan | None = None  # a plan made outside an exchange (a count endpoint)
        self.outcome: str | None = None  # what the guard did (forwarded, trimmed, rejected, counted, ...)
        self.provider_counted = False  # the upstream's own count decided its plan
        self.usage: Usage | None = None  # what the upstream's answer said it counted
        self.calibration: float | None = None  # the estimate's factor its usage taught
        self.upstream_status: int | None = None  # the status line of its (last) upstream call
        self.upstream_ms = 0.0  # the time its upstream calls took
        self.stream_broken: str | None = None  # why the upstream's stream ended early, if it did
        self.client_gone = False  # the client left while its answer was relayed
        self.delivered = False  # the client had the whole answer: leaving after it is no failure


FLOW = web.RequestKey("flow", Flow)  # opened for every request by the records middleware
