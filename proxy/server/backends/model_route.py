"""A model's route: the upstream it goes to (`Router`, `Target`), and what its requests are counted
and sent with, worked out once per model and API (`ModelRoute`).

Every upstream comes from the config; a client can name a model, never a host, so the proxy is
never an open relay. Every request names a model; from it the guard works out the upstream it goes to, the model that
serves it, that model's profile (its window: the config's, the model map's, or the one the server
states), the tokenizer to count with and how it was chosen, the upstream's kind of backend and
the budget policy that follows from it (`ModelRoute`). None of that depends on the request: it
depends on the config, which a reload replaces with a new gateway, and on what the guard learned
of the upstream at start (`Discovery`). So once it is known without asking anyone, it is kept
(`ModelRoutes`, bounded in how many models it remembers) and every later request of that model
and API reads it back: one lookup instead of a dozen (issue 28).

What is not kept, and why:
- a route that had to ask the upstream (an Ollama model's window not asked yet), or whose
  vocabulary was still loading: the next request asks or loads no more, and is kept then;
- a route with no choice (`choice` None): the backend's own tokenizer counts each body;
- anything learned per request or shared between replicas: a correction of the window
  (`SharedCorrections`), which the request looks up itself.
A route whose choice is an estimate (`Choice.source` other than `model`) is kept with the
calibration table's version it was made at (`calibrated_at`): a calibrated estimate's factor moves
as usage is learned, so once the table learned anything since, its choice is made again
(`rechosen`; the rest of the route stands).
A kept route is dropped when the upstream is discovered again (its `Discovery` is another object).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from proxy.apis.fitting import Counting
from proxy.config.settings import Settings
from proxy.config.upstreams import Route, UpstreamSettings
from proxy.core.commands import Chosen, Routed
from proxy.core.counting.tokenizer import Tokenizer
from proxy.core.models.model_registry import ModelProfile
from proxy.core.trimming.budget import BudgetPolicy
from proxy.errors import ModelNotRouted
from proxy.server.backends.catalogue import Backends, Choice
from proxy.server.backends.model_counting import Models
from proxy.server.backends.profiles import BackendProfile, budget_policy
from proxy.tokenizers.map_corrections import correction_for


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


MAX_ROUTES = 4096  # models remembered per gateway: clients name what they like, past this the oldest goes


@dataclass(frozen=True, slots=True)
class ModelRoute:
    """Where a model's requests go and what they are counted with (the fields the log reports
    about it included)."""

    target: Target
    served: str  # the model the upstream serves the request as (after a rename)
    profile: ModelProfile  # with the window the server states, when it states one
    window_source: str  # the record's: where the window came from (`backend`: the server stated it)
    override: str | None  # the pattern of the operator's override that applies, for the log
    map_correction: dict[str, Any] | None
    local: Tokenizer  # the model's own tokenizer (its family's bound, when its vocabulary is missing)
    vocabulary_missing: str | None  # the package the model's vocabulary ships in, when it is not installed
    choice: Choice | None  # None: the backend's tokenizer may count, which the request asks (`Backends.choose`)
    backend: BackendProfile
    budget: BudgetPolicy
    discovery: object | None  # what discovery found of the upstream when this was worked out
    routed: Routed  # what the exchange is told of it (`FindRoute`), before any window a request opts into
    counted: Counting | None  # what its requests are counted as, with `choice` (None: chosen per request)
    calibrated_at: int = 0  # the calibration table's version when `choice` was made (`CalibrationTable.version`)

    @property
    def kept_as_is(self) -> bool:
        """Whether later requests of the model may read this back (see the module docstring)."""
        return self.choice is not None


class ModelRoutes:
    """The routes worked out so far, by (model, API), at most `MAX_ROUTES` of them."""

    def __init__(self) -> None:
        self._routes: OrderedDict[tuple[str, str], ModelRoute] = OrderedDict()  # its oldest popped in O(1)

    def get(self, model: str, api: str, backends: Backends) -> ModelRoute | None:
        """The route kept for `model` and `api`, unless its upstream was discovered again since
        (`backends`: what discovery found, by upstream); an estimate's choice made again when
        calibration learned something since (`backends.calibration`)."""
        route = self._routes.get((model, api))
        if route is None or route.discovery is not backends.discoveries.get(route.target.upstream.name):
            return None
        choice = route.choice
        if choice is not None and choice.source != "model" and route.calibrated_at != backends.calibration.version:
            route = rechosen(route, backends)
            if route is None:  # the backend's tokenizer counts now: worked out anew, and kept no more
                del self._routes[(model, api)]
                return None
            self._routes[(model, api)] = route
        return route

    def put(self, model: str, api: str, route: ModelRoute) -> None:
        """Keep `route`; when `MAX_ROUTES` are kept, the oldest goes (worked out again if asked for):
        a table filled by names nobody sends again must not freeze out the ones that come next."""
        if route.kept_as_is:
            routes = self._routes
            if len(routes) >= MAX_ROUTES and (model, api) not in routes:
                routes.popitem(last=False)
            routes[(model, api)] = route

    def __len__(self) -> int:
        return len(self._routes)


async def model_route(
    models: Models, counting: Backends, model: str, target: Target, stated: int | None
) -> tuple[ModelRoute, bool]:
    """The route of `model` to `target`, worked out now with the gateway's `models` and
    `counting`, `stated` being the window the upstream runs the served model with when it says
    one (`Backends.known_window`, or asked by the caller); and whether a vocabulary had to load
    on the way, which is not kept."""
    upstream = target.upstream
    served = target.model or model
    # The budget follows the model that will serve the request: after a rename, the target's window.
    profile = models.profile(served)
    window_source: str = profile.window_source
    map_correction = correction_for(profile)
    asked = False
    if stated:  # the window the server itself runs the model with (vLLM, llama.cpp, Ollama)
        profile, window_source = dataclasses.replace(profile, context_window=stated), "backend"
    local = models.tokenizers.loaded_by_spec.get(profile.tokenizer)
    if local is None:  # a vocabulary not loaded yet (about a second) loads off the loop
        local, asked = await asyncio.to_thread(models.tokenizer, profile), True
    backend = counting.profile_of(upstream.name)
    choice = counting.local_choice(upstream.name, served, profile, local)
    missing = models.tokenizers.vocabulary_missing(profile.tokenizer)
    routed = Routed(
        profile.context_window,
        window_source,
        vocabulary_missing=missing,
        # The provider a correction names: the upstream's own name for it, else what discovery found it to be.
        provider=upstream.provider.corrections_name or (backend.kind if backend.named_in_corrections else None),
        provider_counts=upstream.provider_count,
        chosen=None if choice is None else chosen_of(choice),
    )
    budget = budget_policy(backend, models.policy.budget, counting.options_for(upstream.name).min_output_tokens)
    route = ModelRoute(
        target=target,
        served=served,
        profile=profile,
        window_source=window_source,
        override=models.override_pattern(served),
        map_correction=map_correction,
        local=local,
        vocabulary_missing=missing,
        choice=choice,
        backend=backend,
        budget=budget,
        discovery=counting.discoveries.get(upstream.name),
        routed=routed,
        counted=None if choice is None else counted_with(choice, upstream, served, budget),
        calibrated_at=counting.calibration.version,
    )
    return route, asked


def rechosen(route: ModelRoute, counting: Backends) -> ModelRoute | None:
    """`route` with its tokenizer chosen again by `counting` as `model_route` chose it (an
    estimate, scaled by what calibration learned by now); None when the choice is the backend's
    to make per body."""
    upstream = route.target.upstream
    choice = counting.local_choice(upstream.name, route.served, route.profile, route.local)
    if choice is None:
        return None
    counted = counted_with(choice, upstream, route.served, route.budget)
    routed = dataclasses.replace(route.routed, chosen=chosen_of(choice))
    version = counting.calibration.version
    return dataclasses.replace(route, choice=choice, routed=routed, counted=counted, calibrated_at=version)


def counted_with(choice: Choice, upstream: UpstreamSettings, served: str, budget: BudgetPolicy) -> Counting:
    """What a route's requests are counted as with `choice` (`Counting`); with the context edits
    the upstream cannot apply, which the guard then does."""
    by_guard = upstream.edits_by_guard
    return Counting(choice.profile, choice.tokenizer, edits_by_guard=by_guard, model=served, budget=budget)


def chosen_of(choice: Choice) -> Chosen:
    """How a request counted with `choice` is counted, as the exchange is told (`Chosen`)."""
    return Chosen(choice.source, recounts=choice.counter is not None)
