"""What the proxy assembles once at start and every request uses: the model registry, the
tokenizers and the count cache, tied to one `Settings`.

Loading happens here, in the shell; `plan()` then hands plain data to the pure core. A
vocabulary is loaded when a model that needs it is first seen, except for the models the config
names (overrides and routes that are not globs): theirs load at construction, so a machine
without them fails at start with a clear message. Each vocabulary costs 40-70 MB of memory.

A configured model whose family's vocabulary package is not installed does not stop the start:
it is counted with its family's bound, and `missing_vocabularies` says so (`check-config` prints
it, `serve` logs it as a warning).

`serve` builds its Models with `preload=False`: the files are checked at construction (a missing
one still stops the start) and `load_configured()` loads them once the process listens, while
`/readyz` says the tokenizers are still loading; a request that needs one meanwhile waits for it.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from proxy.apis.base import Adapter, Parsed
from proxy.apis.fitting import Counting, Fitted, fit
from proxy.config.budget_and_trim import Mode
from proxy.config.settings import Settings
from proxy.core.counting.count_cache import CountCache, ScopedCountCache
from proxy.core.counting.tokenizer import Tokenizer
from proxy.core.models.model_registry import ModelProfile, ModelRegistry, TokenizerSpec
from proxy.core.trimming.compaction import CompactionPolicy
from proxy.errors import ConfigError
from proxy.tokenizers.family_vocabularies import FALLBACK_BOUND
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


def _named_models(settings: Settings) -> list[str]:
    """The models the config names one by one (overrides and routes that are not globs)."""
    patterns = [m.override.pattern for m in settings.models.overrides] + [r.match for r in settings.routes]
    return [pattern for pattern in dict.fromkeys(patterns) if not any(ch in pattern for ch in "*?[")]


def missing_vocabularies(settings: Settings, registry: ModelRegistry, tokenizers: Tokenizers) -> list[dict[str, str]]:
    """For each model the config names whose family's vocabulary package is not installed: the
    model, the vocabulary, the package, and what counts it instead (the family's bound)."""
    missing = []
    for model in _named_models(settings):
        spec = registry.profile(model).tokenizer
        package = tokenizers.vocabulary_missing(spec)
        if package is not None:
            fallback = f"bound:{FALLBACK_BOUND}"
            missing.append({"model": model, "vocabulary": spec.source, "package": package, "counted_with": fallback})
    return missing


def configured_tokenizers(settings: Settings, registry: ModelRegistry) -> list[TokenizerSpec]:
    """The tokenizers of the models the config names: an override's own tokenizer, and the
    looked-up one of every override or route that names one model rather than a glob."""
    specs: dict[TokenizerSpec, None] = {}
    for model in settings.models.overrides:
        if model.override.tokenizer is not None:
            specs[model.override.tokenizer] = None
    for name in _named_models(settings):
        specs[registry.profile(name).tokenizer] = None
    return list(specs)
