"""What the proxy assembles once at start and every request uses: the model registry, the
tokenizers and the count cache, tied to one `Settings`.

Loading happens here, in the shell; `plan()` then hands plain data to the pure core. Both
default encodings are loaded at construction, so a machine without them fails at start with a
clear message instead of on its first request.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from proxy.core.models import ModelProfile, ModelRegistry, TokenizerSpec
from proxy.core.plan import Plan, plan_request
from proxy.core.tokenizer import CountCache, Tokenizer
from proxy.encodings import Tokenizers
from proxy.model_map import load_model_map
from proxy.settings import Mode, Settings

DEFAULT_ENCODINGS = (TokenizerSpec("tiktoken", "o200k_base"), TokenizerSpec("tiktoken", "cl100k_base"))


class Guard:
    def __init__(self, settings: Settings, model_map: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.settings = settings
        if model_map is None:
            model_map = load_model_map(Path(settings.model_map_file) if settings.model_map_file else None)
        self.registry = ModelRegistry(
            model_map,
            overrides=tuple(m.override for m in settings.models),
            fallback_window=settings.fallback_context_window,
        )
        self.tokenizers = Tokenizers([Path(settings.encodings_dir)] if settings.encodings_dir else [])
        self.tokenizers.preload(DEFAULT_ENCODINGS)
        for model in settings.models:  # an operator's tokenizer file that is missing fails at start too
            if model.override.tokenizer is not None:
                self.tokenizers.get(model.override.tokenizer)
        self.cache = CountCache(max_entries=settings.cache_entries)

    def profile(self, model: str) -> ModelProfile:
        return self.registry.profile(model)

    def tokenizer(self, profile: ModelProfile) -> Tokenizer:
        return self.tokenizers.get(profile.tokenizer)

    def mode_for(self, model: str) -> Mode:
        for entry in self.settings.models:
            if entry.mode is not None and self.registry.override_for(model) is entry.override:
                return entry.mode
        return self.settings.mode

    def plan(self, body: Mapping[str, Any], model: str, context_window: int | None = None) -> Plan:
        profile = self.profile(model)
        return plan_request(
            body,
            profile,
            self.tokenizer(profile),
            self.settings.trim,
            self.cache,
            context_window=context_window,
            clock=time.perf_counter,
        )
