"""Helpers for adapter tests: run a body of any API shape through the core with a small window."""

from __future__ import annotations

from typing import Any

from proxy.apis.base import Adapter
from proxy.apis.fitting import Counting, Fitted, fit
from proxy.core.plan import TrimPolicy
from proxy.core.trimming.budget import BudgetPolicy
from proxy.core.trimming.strategies import DEFAULT_PIPELINE, build_pipeline
from tests.support.trimming import profile, tokenizer


def fit_body(
    adapter: Adapter,
    body: dict[str, Any],
    window: int,
    model: str = "gpt-4o",
    pipeline: tuple[str, ...] = DEFAULT_PIPELINE,
    options: dict[str, dict[str, Any]] | None = None,
    overflow: str = "reject",
) -> Fitted:
    policy = TrimPolicy(budget=BudgetPolicy(), pipeline=build_pipeline(pipeline, options), overflow=overflow)  # type: ignore[arg-type]
    parsed = adapter.parse(body)
    return fit(adapter, parsed, Counting(profile(window, model), tokenizer(model)), policy)


def words(n: int, word: str = "lorem") -> str:
    return " ".join([word] * n)
