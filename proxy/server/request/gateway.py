"""What every handler shares: the `Gateway` (built once per app, and again, whole, on a reload)
and the key the app carries it under."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import aiohttp
from aiohttp import web

from proxy.apis.base import Parsed
from proxy.apis.registry import AdapterRegistry
from proxy.config.settings import Settings
from proxy.config.upstreams import UpstreamSettings
from proxy.core.commands import Summary
from proxy.core.learning.corrections import CorrectionPolicy
from proxy.core.trimming.compaction import SummaryRequest
from proxy.errors import GuardError
from proxy.server.backends.catalogue import Backends, Reach
from proxy.server.backends.model_route import model_route
from proxy.server.backends.models import ModelRoute, ModelRoutes, Models, Router, Target
from proxy.server.backends.provider_count import ProviderCounts
from proxy.server.edge.credentials import UpstreamAuth
from proxy.server.edge.paths import PathRoute
from proxy.server.observation.metrics import Metrics
from proxy.server.request.summariser import Summariser
from proxy.server.upstream.connection import request_headers
from proxy.state import MemoryStore, StateStore
from proxy.state.store import HeldLedger, SharedCorrections
from proxy.wire.readers import PARSES_PER_BODY, BodyReaders, KeptPerBody

MODE_HEADER = "x-context-guard-mode"


@dataclass
class Gateway:
    """Everything the handlers share, built once per app (and again, whole, on a reload)."""

    settings: Settings
    models: Models
    router: Router
    auths: dict[str, UpstreamAuth]
    metrics: Metrics
    log: Any
    apis: AdapterRegistry = field(default_factory=AdapterRegistry)
    readers: BodyReaders = field(default_factory=BodyReaders)  # the bodies' strict, incremental readers
    # The requests of bodies sent again, by endpoint (`proxy.wire.readers`).
    parses: KeptPerBody[Parsed] = field(default_factory=lambda: KeptPerBody(PARSES_PER_BODY))
    store: StateStore = field(default_factory=MemoryStore)  # learned state: this process, or Redis
    session: aiohttp.ClientSession | None = None
    summariser: Summariser | None = None  # with trim.summarize_dropped, opened with the session
    backends: Backends = field(default_factory=Backends)  # backend tokenizers, stated windows, calibration
    provider_counts: ProviderCounts = field(default_factory=ProviderCounts)  # counts asked at the budget's edge
    _service: dict[str, tuple[str | None, Mapping[str, str]]] = field(default_factory=dict, init=False, repr=False)
    # The route each (canonical path, method) took: the same few recur on every request.
    routes: dict[tuple[str, str], PathRoute] = field(default_factory=dict, init=False, repr=False)
    # What each model's requests are counted and sent with (`proxy.server.backends.models`).
    model_routes: ModelRoutes = field(default_factory=ModelRoutes, init=False, repr=False)

    @functools.cached_property
    def corrections(self) -> SharedCorrections:
        return SharedCorrections(self.store, self.settings.self_correction.ttl_seconds)

    @functools.cached_property
    def ledger(self) -> HeldLedger:
        """What the provider holds for each client (stored responses, conversations, caches), in the same store."""
        return HeldLedger(self.store)

    @functools.cached_property
    def correction_policy(self) -> CorrectionPolicy | None:
        """`self_correction.policy`, made once per gateway (a reload builds a new gateway)."""
        return self.settings.self_correction.policy

    def service_headers(self, upstream: UpstreamSettings, authorization: str | None) -> Mapping[str, str]:
        """The headers the guard's own calls to `upstream` carry (tokenize, window, discovery):
        its configured headers and `authorization`. Built once per upstream and kept while the
        credential stays the same; a rotated one (a new token, a changed key) builds them anew."""
        kept = self._service.get(upstream.name)
        if kept is None or kept[0] != authorization:
            headers = MappingProxyType(dict(request_headers({}, upstream, authorization)))
            kept = self._service[upstream.name] = (authorization, headers)
        return kept[1]

    async def reach(self, upstream: UpstreamSettings) -> Reach:
        """How the guard's own calls reach `upstream` (tokenize, a window): the app's session and
        the headers of the guard's own credential."""
        session = self.session
        assert session is not None, "the app's upstream session is opened at startup"
        try:
            auth = await self.auths[upstream.name].header(None, False)
        except GuardError:  # a token that cannot be had now: the calls go without it, and fall back
            auth = None
        return Reach(session, upstream.name, upstream.base_url, self.service_headers(upstream, auth))

    async def route_of(self, model: str, target: Target) -> tuple[ModelRoute, bool]:
        """`model`'s route worked out (`model_route`), after asking the upstream for the served
        model's window when it was not asked yet (with the guard's own credential); and whether
        anyone was asked (the route is not kept then)."""
        upstream, served = target.upstream, target.model or model
        known, stated = self.backends.known_window(upstream.name, served)
        if not known:
            stated = await self.backends.window(await self.reach(upstream), served)
        route, loaded = await model_route(self.models, self.backends, model, target, stated)
        return route, loaded or not known

    async def summary(self, request: SummaryRequest) -> Summary:
        """The summariser's summary of what a trim dropped, asked with its upstream's credential."""
        summariser = self.summariser
        assert summariser is not None, "the exchange asks for summaries only when a summariser is set"
        upstream = self.settings.upstreams[summariser.upstream]
        auth = await self.auths[upstream.name].header(None, False)
        outcome = await summariser.summarise(request, dict(request_headers({}, upstream, auth)))
        return Summary(outcome.text, outcome.status)


GATEWAY = web.AppKey("gateway", Gateway)
