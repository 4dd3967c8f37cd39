"""The paths context-guard answers itself, in one table: what serves each, and who may call it.

`LOCAL_PATHS` maps a canonical path (`proxy.server.edge.paths`) to its `LocalPath`: the handler the
app's dispatch calls, and its access rule. The canonical-path middleware routes from it (a local
path is never forwarded, and takes GET or HEAD only); the client-key check and the request log
read their rules from it. Adding a local endpoint is one row here.

- the probes (`/livez`, `/readyz`, `/healthz`) are open: probes carry no credentials; and an
  answered probe is not logged, as probes every few seconds would drown the request log;
- `/metrics` needs a client key unless `server.metrics_public`;
- the page of recent decisions checks its own access (its admin key may be no client key).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from aiohttp import web

from proxy.server.observation.health import healthz, livez, readyz
from proxy.server.observation.page import JSON_PATH, PAGE_PATH, recent_json, recent_page
from proxy.server.request.gateway import GATEWAY

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Access = Literal["probe", "metrics", "own"]


async def metrics(request: web.Request) -> web.Response:
    """The gateway's metrics in Prometheus' text format."""
    body = request.app[GATEWAY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


@dataclass(frozen=True, slots=True)
class LocalPath:
    """One local endpoint: its name (the route's `api`), its handler and who may call it
    (`probe`: anyone; `metrics`: a client key unless metrics are public; `own`: it checks itself)."""

    name: str
    handler: Handler
    access: Access


LOCAL_PATHS: Mapping[str, LocalPath] = {
    "/healthz": LocalPath("healthz", healthz, "probe"),
    "/livez": LocalPath("livez", livez, "probe"),
    "/readyz": LocalPath("readyz", readyz, "probe"),
    "/metrics": LocalPath("metrics", metrics, "metrics"),
    PAGE_PATH: LocalPath("page", recent_page, "own"),
    JSON_PATH: LocalPath("page_json", recent_json, "own"),
}

HEALTH_PATHS = frozenset(path for path, local in LOCAL_PATHS.items() if local.access == "probe")


def local_name(path: str) -> str | None:
    """The name of the local endpoint at canonical `path`; None when the proxy does not answer it."""
    local = LOCAL_PATHS.get(path)
    return local.name if local is not None else None


def open_without_client_key(path: str, metrics_public: bool) -> bool:
    """True for a local path the proxy's client keys do not guard: a probe, `/metrics` when public,
    and the page (which checks its own keys)."""
    local = LOCAL_PATHS.get(path)
    if local is None:
        return False
    return local.access in ("probe", "own") or (local.access == "metrics" and metrics_public)


def is_probe(path: str) -> bool:
    """True for a health probe's path, whose answers are not logged when they succeed."""
    return path in HEALTH_PATHS
