"""What every handler shares: the `Gateway` (built once per app, and again, whole, on a reload)
and the keys the app and the request carry it and the request's record under."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from proxy.apis.registry import AdapterRegistry
from proxy.guard import Guard
from proxy.server.compaction import Summariser
from proxy.server.counting import Counting
from proxy.server.credentials import UpstreamAuth
from proxy.server.metrics import Metrics
from proxy.server.record import RequestRecord
from proxy.server.upstream import Router
from proxy.settings import Settings
from proxy.state import MemoryStore, StateStore
from proxy.state.corrections import SharedCorrections

MODE_HEADER = "x-context-guard-mode"
RECORD = web.RequestKey("record", RequestRecord)  # opened for every request by the records middleware


@dataclass
class Gateway:
    """Everything the handlers share, built once per app (and again, whole, on a reload)."""

    settings: Settings
    guard: Guard
    router: Router
    auths: dict[str, UpstreamAuth]
    metrics: Metrics
    log: Any
    apis: AdapterRegistry = field(default_factory=AdapterRegistry)
    store: StateStore = field(default_factory=MemoryStore)  # learned state: this process, or Redis
    session: aiohttp.ClientSession | None = None
    summariser: Summariser | None = None  # with trim.summarize_dropped, opened with the session
    counting: Counting = field(default_factory=Counting)  # backend tokenizers, stated windows, calibration

    @functools.cached_property
    def corrections(self) -> SharedCorrections:
        return SharedCorrections(self.store, self.settings.self_correction.ttl_seconds)


GATEWAY = web.AppKey("gateway", Gateway)
