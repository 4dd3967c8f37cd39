"""Helpers for trimming tests: a profile with any window, a one-call trim, a recount of a
forwarded body, and the conversations (a tool call, a growing chat, mixed-script words) several test modules build."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from proxy.core.counting.request_count import RequestCounter
from proxy.core.counting.tokenizer import Tokenizer
from proxy.core.models.model_registry import ModelProfile, ModelRegistry
from proxy.core.plan import Plan, TrimPolicy, plan_request
from proxy.core.trimming.budget import PINNED_ROLES, BudgetPolicy, protected_start
from proxy.core.trimming.compaction import CompactionPolicy
from proxy.core.trimming.strategies import DEFAULT_PIPELINE, build_pipeline
from proxy.tokenizers.model_map import load_model_map
from proxy.tokenizers.vocabularies import Tokenizers

WORDS = ["alpha", "beta", "gamma", "delta", "río", "数据", "東京", "{", "}", "\n", "def", "return", "42"]

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
    return plan_request(body, RequestCounter(p, tokenizer()), policy)


def words(n: int, word: str = "lorem") -> str:
    """About `n` tokens of text."""
    return " ".join([word] * n)


def quick_split(messages: list[dict[str, Any]]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The pinned and protected indices as the trim's quick check reads them: pinned by role, and
    protected from `protected_start` on but for those."""
    start = protected_start(messages)
    if start is None:
        return None
    pinned = tuple(i for i, m in enumerate(messages) if m.get("role") in PINNED_ROLES)
    return pinned, tuple(i for i in range(start, len(messages)) if i not in pinned)


def call(*ids: str) -> dict:
    """An assistant message calling one tool per id."""
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": i, "type": "function", "function": {"name": "f", "arguments": "{}"}} for i in ids],
    }


def growing(turns: int, answer_tokens: int = 100) -> list[dict[str, Any]]:
    """The history of a chat with `turns` question-answer turns, without the newest question."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful."}]
    for i in range(turns):
        messages += [
            {"role": "user", "content": f"q{i} " + words(60)},
            {"role": "assistant", "content": f"a{i} " + words(answer_tokens, "ipsum")},
        ]
    return messages


def request(turns: int, answer_tokens: int = 100) -> dict[str, Any]:
    """A chat-completions body: `growing(turns)` and the newest question."""
    return {"messages": [*growing(turns, answer_tokens), {"role": "user", "content": f"newest {turns}"}]}


def recount(body: Any, window: int) -> int:
    """The guard's own count of `body` for gpt-4o (a trimmed body re-counted, not an independent check)."""
    return RequestCounter(profile(window), tokenizer()).request(body).total
