"""Where a request goes: the routes of one configuration, a model's upstream and the name sent.

Every upstream comes from the config; a client can name a model, never a host, so the proxy is
never an open relay."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.config.settings import Settings
from proxy.config.upstreams import Route, UpstreamSettings
from proxy.errors import ModelNotRouted


@dataclass(frozen=True)
class Target:
    upstream: UpstreamSettings
    model: str | None  # the name to send upstream (renamed by the route, if it says so)


class Router:
    """The routes of one configuration. A model's target is worked out once (the routes' globs
    tried in order) and kept, for at most `MAX_ROUTED` model names (clients name what they like:
    past the bound the oldest kept goes, so names nobody sends again do not freeze the table);
    a reload builds a new gateway and with it a new router, so nothing kept outlives the routes
    it came from."""

    MAX_ROUTED = 4096

    def __init__(self, settings: Settings) -> None:
        self.upstreams = settings.upstreams
        self.routes: tuple[Route, ...] = settings.routes
        self._routed: dict[str, Target | None] = {}  # None: no route matches

    def route(self, model: str | None) -> Target:
        """The upstream for `model`: the first route whose name or glob matches it."""
        if model is None:
            return self.default()
        try:
            target = self._routed[model]
        except KeyError:
            target = self._first_match(model)
            routed = self._routed
            if len(routed) >= self.MAX_ROUTED:
                del routed[next(iter(routed))]
            routed[model] = target
        if target is None:
            raise ModelNotRouted(f"no upstream is configured for model {model!r}", param="model")
        return target

    def _first_match(self, model: str) -> Target | None:
        for route in self.routes:
            if route.matches(model):
                return Target(self.upstreams[route.upstream], route.rename or model)
        return None

    def default(self) -> Target:
        """For requests that name no model: the catch-all route's upstream, else the first route's."""
        route = next((r for r in self.routes if r.match == "*"), self.routes[0])
        return Target(self.upstreams[route.upstream], None)
