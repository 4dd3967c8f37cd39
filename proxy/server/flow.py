"""One request's state, in one object (a flow, in mitmproxy's sense).

The `records` middleware opens a `Flow` for every request that reaches the app: the request, the
gateway it is served by (one for the whole request, even across a reload) and its `RequestRecord`.
Each step after it reads what it needs from the flow and adds what it worked out: the handler the
client, its scope and the parsed body; `proxy.server.perform.prepared` the upstream target. The
steps take the flow, not the pieces of it one by one.
"""

from __future__ import annotations

from collections.abc import Hashable

from aiohttp import web

from proxy.apis.base import Parsed
from proxy.apis.registry import Endpoint
from proxy.server.gateway import Gateway
from proxy.server.record import RequestRecord
from proxy.server.upstream.routing import Target


class Flow:
    """One request: what it is, who sent it, where it goes, and its record. `endpoint` and `parsed`
    are set once a guarded request's body is parsed, `target` once it is routed; nothing reads
    them before."""

    __slots__ = ("client", "endpoint", "gw", "large", "parsed", "raw", "record", "request", "scope", "target")
    target: Target  # the upstream it is sent to
    endpoint: Endpoint  # the API adapter its path names
    parsed: Parsed  # its body as the adapter parsed it

    def __init__(self, request: web.Request, gw: Gateway, record: RequestRecord) -> None:
        self.request, self.gw, self.record = request, gw, record
        self.client = ""  # its share of the threads and upstream calls (`proxy.server.slots.client_key`)
        self.scope: Hashable = None  # its part of the count cache (`proxy.server.client_scope`)
        self.raw = b""  # its body, decoded, as received
        self.large = False  # over `server.offload_bytes` of new bytes: its work goes to the large-body threads


FLOW = web.RequestKey("flow", Flow)  # opened for every request by the records middleware
