"""Helpers for trimming tests: a profile with any window, and a one-call trim."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from proxy.core.budget import BudgetPolicy
from proxy.core.models import ModelProfile, ModelRegistry
from proxy.core.notes import CompactionPolicy
from proxy.core.plan import Plan, TrimPolicy, plan_request
from proxy.core.strategies import DEFAULT_PIPELINE, build_pipeline
from proxy.core.tokenizer import Tokenizer
from proxy.encodings import Tokenizers
from proxy.model_map import load_model_map

_REGISTRY: ModelRegistry | None = None
_TOKENIZERS = Tokenizers()


def profile(window: int, model: str = "gpt-4o") -> ModelProfile:
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = ModelRegistry(load_model_map())
    return replace(_REGISTRY.profile(model), context_window=window)


def tokenizer(model: str = "gpt-4o") -> Tokenizer:
    return _TOKENIZERS.get(profile(1000, model).tokenizer)


def fit(
    body: dict[str, Any],
    window: int,
    pipeline: tuple[str, ...] = DEFAULT_PIPELINE,
    options: dict[str, dict[str, Any]] | None = None,
    overflow: str = "reject",
    budget: BudgetPolicy | None = None,
    note: bool = False,
    summarize: bool = False,
) -> Plan:
    policy = TrimPolicy(
        budget=budget or BudgetPolicy(),
        pipeline=build_pipeline(pipeline, options),
        overflow=overflow,  # type: ignore[arg-type]
        compaction=CompactionPolicy(budget_note=note, summarize_dropped=summarize),
    )
    p = profile(window)
    return plan_request(body, p, tokenizer(), policy)


def words(n: int, word: str = "lorem") -> str:
    """About `n` tokens of text."""
    return " ".join([word] * n)
