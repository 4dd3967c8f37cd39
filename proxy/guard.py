"""What the proxy assembles once at start and every request uses: the model registry, the
tokenizers and the count cache, tied to one `Settings`.

Loading happens here, in the shell; `plan()` then hands plain data to the pure core. A
vocabulary is loaded when a model that needs it is first seen, except for the models the config
names (overrides and routes that are not globs): theirs load at construction, so a machine
without them fails at start with a clear message. Each vocabulary costs 40-70 MB of memory.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from proxy.apis.base import Adapter, Fitted, Parsed, fit
from proxy.core.models import ModelProfile, ModelRegistry, TokenizerSpec
from proxy.core.notes import CompactionPolicy
from proxy.core.plan import Plan, plan_request
from proxy.core.tokenizer import CountCache, Tokenizer
from proxy.encodings import Tokenizers
from proxy.errors import ConfigError
from proxy.model_map import load_model_map
from proxy.settings import Mode, Settings


class Guard:
    def __init__(self, settings: Settings, model_map: Mapping[str, Mapping[str, Any]] | None = None) -> None:
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
        self.tokenizers.preload(configured_tokenizers(settings, self.registry))
        self.cache = CountCache(max_entries=tokenizers.cache_entries)
        self.policy = settings.trim_policy
        self._without_note = replace(self.policy, compaction=CompactionPolicy())

    def profile(self, model: str) -> ModelProfile:
        return self.registry.profile(model)

    def tokenizer(self, profile: ModelProfile) -> Tokenizer:
        return self.tokenizers.get(profile.tokenizer)

    def mode_for(self, model: str) -> Mode:
        return self.settings.mode_for_override(self.registry.override_for(model))

    def model_label(self, model: str | None) -> str:
        """A bounded name for metrics: the override pattern or model-map key `model` resolved to,
        else `other`. Never the client's raw string."""
        if not model:
            return "none"
        return self.profile(model).matched or "other"

    def plan(
        self,
        body: Mapping[str, Any],
        model: str,
        context_window: int | None = None,
        counting: tuple[ModelProfile, Tokenizer] | None = None,
    ) -> Plan:
        """Count and trim `body` for `model`. `counting` replaces the model's own profile and
        tokenizer for this request (the backend's tokenizer, a calibrated estimate); its counts
        bypass the shared cache, whose entries are keyed by tokenizer name."""
        profile, tokenizer = counting if counting is not None else (self.profile(model), None)
        return plan_request(
            body,
            profile,
            tokenizer if tokenizer is not None else self.tokenizer(profile),
            self.policy,
            self.cache if tokenizer is None else None,
            context_window=context_window,
            clock=time.perf_counter,
        )

    def fit(
        self,
        adapter: Adapter,
        parsed: Parsed,
        model: str,
        context_window: int | None = None,
        counting: tuple[ModelProfile, Tokenizer] | None = None,
    ) -> Fitted:
        """Count and trim a parsed request of any API shape for `model`, written back in its shape.
        `counting` is as for `plan()`."""
        profile, tokenizer = counting if counting is not None else (self.profile(model), None)
        # The budget note is written into chat completions only; other shapes are cut without it.
        policy = self.policy if adapter.name == "chat" else self._without_note
        return fit(
            adapter,
            parsed,
            profile,
            tokenizer if tokenizer is not None else self.tokenizer(profile),
            policy,
            self.cache if tokenizer is None else None,
            context_window=context_window,
            clock=time.perf_counter,
        )


def configured_tokenizers(settings: Settings, registry: ModelRegistry) -> list[TokenizerSpec]:
    """The tokenizers of the models the config names: an override's own tokenizer, and the
    looked-up one of every override or route that names one model rather than a glob."""
    specs: dict[TokenizerSpec, None] = {}
    for model in settings.models.overrides:
        if model.override.tokenizer is not None:
            specs[model.override.tokenizer] = None
    patterns = [m.override.pattern for m in settings.models.overrides] + [r.match for r in settings.routes]
    for pattern in patterns:
        if not any(ch in pattern for ch in "*?["):
            specs[registry.profile(pattern).tokenizer] = None
    return list(specs)
