"""The `trim` section of the settings: the mode, the budget, the strategies and their options,
the summariser (`proxy.config.settings` reads the whole file)."""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Annotated, Any, Literal

from proxy.config.schema import Bounds, PositiveFloat, SchemaError, carried, convert, shown
from proxy.core.trimming.budget import BudgetPolicy
from proxy.core.trimming.strategies import DEFAULT_PIPELINE, STRATEGIES, build_pipeline

Mode = Literal["enforce", "dry_run", "off"]
MODES: tuple[Mode, ...] = ("enforce", "dry_run", "off")


# The core's budget policy fields the `budget` section writes under another name.
_BUDGET_SETTINGS = {
    "reserve_ratio": "output_reserve_ratio",
    "reserve_min": "output_reserve_min",
    "reserve_max": "output_reserve_max",
    "safety_ratio": "safety_margin_ratio",
    "safety_min": "safety_margin_min",
}


@dataclass(frozen=True, kw_only=True)
class BudgetSettings:
    output_reserve_ratio: Annotated[float, Bounds(ge=0, lt=1)] = 0.15
    output_reserve_min: Annotated[int, Bounds(ge=0)] = 500
    output_reserve_max: Annotated[int, Bounds(ge=0)] = 4096
    safety_margin_ratio: Annotated[float, Bounds(ge=0, lt=1)] = 0.05
    safety_margin_min: Annotated[int, Bounds(ge=0)] = 0
    constrained_below: Annotated[int, Bounds(ge=0)] = 1000

    @cached_property
    def policy(self) -> BudgetPolicy:
        return carried(BudgetPolicy, self, _BUDGET_SETTINGS)

    def __post_init__(self) -> None:
        if self.output_reserve_max < self.output_reserve_min:
            raise ValueError("need output_reserve_min <= output_reserve_max")


@dataclass(frozen=True, kw_only=True)
class SummariserSettings:
    """The model that writes summaries of dropped history, through one of the configured upstreams."""

    upstream: str
    model: Annotated[str, Bounds(min_length=1)]
    deadline_seconds: PositiveFloat = 10.0
    max_response_bytes: Annotated[int, Bounds(ge=1024)] = 65_536
    max_input_chars: Annotated[int, Bounds(ge=1000)] = 200_000
    cache_entries: Annotated[int, Bounds(ge=1)] = 1024


@dataclass(frozen=True, kw_only=True)
class TrimSettings:
    mode: Mode = "enforce"
    overflow: Literal["reject", "forward"] = "reject"
    # A chat request carrying the client's own prompt template (vLLM's `chat_template`): refused
    # (400) in enforce mode, since what it renders is beyond counting; `forward` sends it as it came.
    client_templates: Literal["refuse", "forward"] = "refuse"
    pipeline: tuple[str, ...] = DEFAULT_PIPELINE
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    # A short factual system note in a trimmed chat request: "12 earlier messages, 8,412 tokens, were
    # removed to fit the context window", so the model knows its history is partial.
    budget_note: bool = False
    # Summarise what was dropped with a model of its own and put the summary in its place (chat
    # completions; off by default). Summaries are cached by the span they replace, so the next turns
    # reuse the same text and the same cached prefix; a slow, failing or oversized one falls back to
    # plain dropping.
    summarize_dropped: bool = False
    summary_share: Annotated[float, Bounds(gt=0, lt=0.5)] = 0.1
    summary_max_tokens: Annotated[int, Bounds(ge=50)] = 1000
    summariser: SummariserSettings | None = None

    def __post_init__(self) -> None:
        if self.summarize_dropped and self.summariser is None:
            raise SchemaError("is required when trim.summarize_dropped is true", ("summariser",))
        for name in self.options:
            if name not in STRATEGIES:
                raise SchemaError(f"unknown strategy; known: {', '.join(STRATEGIES)}", ("options", name))
        for name, options in self.options.items():
            check_strategy_options(name, build_pipeline([name])[0], options)
        try:
            build_pipeline(self.pipeline, self.options)
        except ValueError as exc:
            raise SchemaError(str(exc), ("pipeline",)) from None


def check_strategy_options(name: str, strategy: object, options: Mapping[str, Any]) -> None:
    """Each option of a strategy has the type its field declares, and no count is negative (a
    SchemaError at `options.<strategy>.<option>` of the trim section)."""
    hints = typing.get_type_hints(type(strategy))
    for key, value in options.items():
        where = ("options", name, key)
        if key not in hints:
            known = ", ".join(sorted(set(hints) - {"name", "which"}))
            raise SchemaError(f"unknown option; known: {known}", where)
        try:
            convert(hints[key], value, strict=True)
        except SchemaError as exc:
            raise exc.within(*where) from None
        numbers = value.values() if isinstance(value, Mapping) else [value]
        if any(isinstance(n, int | float) and not isinstance(n, bool) and n < 0 for n in numbers):
            raise SchemaError(f"must be at least 0, not {shown(value)}", where)
