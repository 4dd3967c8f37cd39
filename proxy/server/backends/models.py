"""The models a gateway serves, as every request looks them up: where each goes (`Router`,
`Target`), what it is counted with (`Models`: the model registry, the tokenizers and the count
cache, and `fit`), and its route as worked out once per model and API (`ModelRoute`, kept in
`ModelRoutes`; worked out by `proxy.server.backends.model_route`).

Every upstream comes from the config; a client can name a model, never a host, so the proxy is
never an open relay. A route depends on the config, which a reload replaces with a new gateway,
and on what the guard learned of the upstream at start (`Discovery`): so once it is known without
asking anyone, it is kept (bounded in how many models it remembers) and every later request of
that model and API reads it back: one lookup instead of a dozen. What is not kept, and why:
- a route that had to ask the upstream (an Ollama model's window not asked yet), or whose
  vocabulary was still loading: the next request asks or loads no more, and is kept then;
- a route with no choice (`choice` None): the backend's own tokenizer counts each body;
- anything learned per request or shared between replicas: a correction of the window
  (`SharedCorrections`), which the request looks up itself.
A route whose choice is an estimate (`Choice.source` other than `model`) is kept with the
calibration table's version it was made at (`calibrated_at`): a calibrated estimate's factor moves
as usage is learned, so once the table learned anything since, its choice is made again
(`rechosen`; the rest of the route stands). A kept route is dropped when the upstream is
discovered again (its `Discovery` is another object).

Loading happens here, in the shell; `plan()` then hands plain data to the pure core. A
vocabulary is loaded when a model that needs it is first seen, except for the models the config
names (overrides and routes that are not globs): theirs load at construction, so a machine
without them fails at start with a clear message (`proxy.tokenizers.at_start`). A configured
model whose family's vocabulary package is not installed does not stop the start: it is counted
with its family's bound, and `missing_vocabularies` says so (`check-config` prints it, `serve`
logs it as a warning). `serve` builds its Models with `preload=False`: the files are checked at
construction (a missing one still stops the start) and `load_configured()` loads them once the
process listens, while `/readyz` says the tokenizers are still loading; a request that needs one
meanwhile waits for it.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from proxy.apis.base import Adapter, Parsed
from proxy.apis.fitting import Counting, Fitted, fit
from proxy.config.budget_and_trim import Mode
from proxy.config.settings import Settings
from proxy.config.upstreams import Route, UpstreamSettings
from proxy.core.commands import Chosen, Routed
from proxy.core.counting.count_cache import CountCache, ScopedCountCache
from proxy.core.counting.tokenizer import Tokenizer
from proxy.core.models.model_registry import ModelProfile, ModelRegistry
from proxy.core.trimming.budget import BudgetPolicy
from proxy.core.trimming.compaction import CompactionPolicy
from proxy.errors import ConfigError, ModelNotRouted
from proxy.server.backends.catalogue import Backends, Choice
from proxy.server.backends.profiles import BackendProfile
from proxy.tokenizers.at_start import configured_tokenizers, missing_vocabularies
from proxy.tokenizers.model_map import load_model_map
from proxy.tokenizers.vocabularies import Tokenizers
from proxy.wire.readers import ResentPlans


class Models:
    def __init__(
        self, settings: Settings, model_map: Mapping[str, Mapping[str, Any]] | None = None, preload: bool = True
    ) -> None:
        self.settings = settings
        models, tokenizers = settings.models, settings.tokenizers
        if model_map is None:
            model_map = load_model_map(Path(models.map_file) if models.map_file else None)
        self.registry = ModelRegistry(
            model_map,
            overrides=tuple(m.override for m in models.overrides),
            fallback_window=models.fallback_context_window,
        )
        self.tokenizers = Tokenizers([Path(tokenizers.encodings_dir)] if tokenizers.encodings_dir else [])
        for i, model in enumerate(models.overrides):  # an operator's tokenizer that cannot load fails at start
            if model.override.tokenizer is not None:
                try:
                    self.tokenizers.get(model.override.tokenizer)
                except ConfigError as exc:
                    known = ", ".join(self.tokenizers.available_encodings()) or "none"
                    raise ConfigError(
                        f"{exc.args[0]} (tiktoken encodings on disk: {known})",
                        source=settings.source,
                        key=f"models.overrides[{i}].tokenizer",
                    ) from None
        self.configured = configured_tokenizers(settings, self.registry)
        for spec in self.configured:
            self.tokenizers.check(spec)
        self.missing_vocabularies = missing_vocabularies(settings, self.registry, self.tokenizers)
        if preload:
            self.load_configured()
        self.cache = CountCache(max_entries=tokenizers.cache_entries, max_bytes=tokenizers.cache_bytes)
        self.shares_count_cache = tokenizers.share_count_cache
        self.policy = settings.trim_policy
        self._without_note = replace(self.policy, compaction=CompactionPolicy())
        self.resent = ResentPlans(time.perf_counter)  # the plans of bodies sent again as they were

    def load_configured(self) -> None:
        """Load the vocabularies of the models the config names (about half a second each)."""
        self.tokenizers.preload(self.configured)

    def profile(self, model: str) -> ModelProfile:
        return self.registry.profile(model)

    def tokenizer(self, profile: ModelProfile) -> Tokenizer:
        return self.tokenizers.get(profile.tokenizer)

    def override_pattern(self, model: str) -> str | None:
        """The pattern of the operator's override that applies to `model` (matched by its
        normalised names, as the model map is), or None."""
        override = self.registry.override_for(model)
        return override.pattern if override is not None else None

    def mode_for(self, model: str) -> Mode:
        """The mode `model`'s requests run in: its override's, else `trim.mode`."""
        override = self.registry.override_for(model)
        for entry in self.settings.models.overrides:
            if entry.mode is not None and override is entry.override:
                return entry.mode
        return self.settings.trim.mode

    def model_label(self, model: str | None) -> str:
        """A bounded name for metrics: the override pattern or model-map key `model` resolved to,
        else `other`. Never the client's raw string."""
        if not model:
            return "none"
        return self.profile(model).matched or "other"

    def count_cache(self, client: object | None) -> CountCache:
        """The count cache as `client` (`proxy.server.threads.placement`) sees it: its own part of the
        shared one, unless `tokenizers.share_count_cache` (or no client is named: the CLI)."""
        if self.shares_count_cache or client is None:
            return self.cache
        return ScopedCountCache(self.cache, client)

    def counted_as(self, model: str) -> Counting:
        """`model` counted with its own profile and tokenizer (for a request that names another)."""
        profile = self.profile(model)
        return Counting(profile, self.tokenizer(profile), model=model)

    def _counting(
        self, model: str, counted: Counting | None, client: object | None = None
    ) -> tuple[ModelProfile, Tokenizer, CountCache | None]:
        """The profile, tokenizer and cache to count with. The shared cache serves the profile's
        own loaded tokenizer, whichever profile it came with; any other tokenizer (the backend's,
        an estimate scaled by calibration, whose factor moves) counts without it. `client` scopes
        the cache (`count_cache`)."""
        if counted is None:
            profile = self.profile(model)
            return profile, self.tokenizer(profile), self.count_cache(client)
        profile, tokenizer = counted.profile, counted.tokenizer
        own = tokenizer is self.tokenizers.loaded_by_spec.get(profile.tokenizer)
        return profile, tokenizer, self.count_cache(client) if own else None

    def fit(
        self,
        adapter: Adapter,
        parsed: Parsed,
        context_window: int | None = None,
        counted: Counting | None = None,
        client: object | None = None,
    ) -> Fitted:
        """Count and trim a parsed request of any API shape, written back in its shape: for the
        model it names with that model's profile and tokenizer, or as `counted` says (see
        `_counting` for which counts go through the shared cache); for `context_window` (None: the
        profile's); `client` scopes the count cache."""
        model = counted.model if counted is not None else parsed.model or ""
        profile, tokenizer, cache = self._counting(model, counted, client)
        # The budget note and a summary go in where the adapter can write them (not legacy completions).
        base = policy = self.policy if adapter.writes_inserted else self._without_note
        budget = counted.budget if counted is not None else None
        by_guard = counted is not None and counted.edits_by_guard

        def made() -> Fitted:
            counting = Counting(profile, tokenizer, cache, context_window, by_guard, model, budget)
            return fit(adapter, parsed, counting, policy, time.perf_counter)

        if cache is None:  # counted past the cache (the backend's tokenizer, a calibrated estimate): not kept
            return made()

        def key() -> Hashable:  # what else the plan depended on
            fixed, identity = parsed.fixed_tokens, tokenizer.identity  # fixed: held context
            used = budget if budget is not None else policy.budget  # the budget `fit` plans with
            return (adapter.name, model, context_window, profile, identity, id(base), used, client, fixed, by_guard)

        return self.resent.fitted(parsed, key, made)


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
