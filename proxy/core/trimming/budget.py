"""The input budget: context window - output reserve - safety margin.

The output reserve is what the request itself asks for (`max_completion_tokens`, else
`max_tokens`) when it asks; otherwise a share of the window (15%) clamped to [500, 4096]. The
safety margin (5% of the window) absorbs the difference between our count and the provider's.

Some servers (llama.cpp, llama-cpp-python, Ollama) do not refuse a prompt + `max_tokens` over the
window: they lower `max_tokens` to what the window leaves. For them (`output_must_fit` False) the
reserve is what the server will really leave, `min(requested, window - margin - prompt)`, never
below `min_output` (or the requested output, when that is smaller): a 7-token prompt with
`max_tokens` 4096 fits a 2,048-token window, and a long one is cut to leave `min_output` free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class BudgetPolicy:
    reserve_ratio: float = 0.15
    reserve_min: int = 500
    reserve_max: int = 4096
    safety_ratio: float = 0.05
    safety_min: int = 0
    constrained_below: int = 1000  # history room under which a request is `is_constrained`
    output_must_fit: bool = True  # False: the server lowers max_tokens to what the window leaves
    min_output: int | None = None  # with output_must_fit False: output kept free at least; None: default reserve

    def __post_init__(self) -> None:
        if not 0 <= self.reserve_ratio < 1 or not 0 <= self.safety_ratio < 1:
            raise ValueError("reserve_ratio and safety_ratio must be in [0, 1)")
        if self.reserve_min < 0 or self.reserve_max < self.reserve_min:
            raise ValueError("need 0 <= reserve_min <= reserve_max")
        if self.safety_min < 0 or self.constrained_below < 0:
            raise ValueError("safety_min and constrained_below must be >= 0")
        if self.min_output is not None and self.min_output < 0:
            raise ValueError("min_output must be >= 0")


@dataclass(frozen=True, slots=True)
class Budget:
    context_window: int
    output_reserve: int
    reserve_source: str  # "max_completion_tokens", "max_tokens" or "default"
    safety_margin: int
    input_budget: int
    prompt_tokens: int
    pinned_tokens: int  # what no trimming may remove: system, latest user turn, tools, framing

    @property
    def fits(self) -> bool:
        return self.prompt_tokens <= self.input_budget

    @property
    def overflow(self) -> int:
        """Tokens over the budget; negative when there is room to spare."""
        return self.prompt_tokens - self.input_budget

    @property
    def history_room(self) -> int:
        return max(0, self.input_budget - self.pinned_tokens)

    def is_constrained(self, policy: BudgetPolicy) -> bool:
        return self.history_room < policy.constrained_below

    def to_dict(self, policy: BudgetPolicy) -> dict[str, Any]:
        return {
            "context_window": self.context_window,
            "output_reserve": self.output_reserve,
            "reserve_source": self.reserve_source,
            "safety_margin": self.safety_margin,
            "input_budget": self.input_budget,
            "prompt_tokens": self.prompt_tokens,
            "fits": self.fits,
            "overflow": self.overflow,
            "history_room": self.history_room,
            "is_constrained": self.is_constrained(policy),
        }


def requested_output(body: Mapping[str, Any]) -> tuple[int | None, str]:
    """The output length the request asks for, and the field it came from."""
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value, key
    return None, "default"


def thinking_budget(body: Mapping[str, Any]) -> int | None:
    """The tokens of extended thinking the request allows (Anthropic's `thinking.budget_tokens`,
    with `type` "enabled"), which Anthropic requires to stay below `max_tokens`; None without."""
    thinking = body.get("thinking")
    if not isinstance(thinking, Mapping) or thinking.get("type") != "enabled":
        return None
    budget = thinking.get("budget_tokens")
    return budget if isinstance(budget, int) and not isinstance(budget, bool) and budget >= 0 else None


def default_reserve(context_window: int, policy: BudgetPolicy) -> int:
    return max(policy.reserve_min, min(policy.reserve_max, int(context_window * policy.reserve_ratio)))


def input_budget(
    context_window: int,
    body: Mapping[str, Any],
    prompt_tokens: int,
    pinned_tokens: int,
    policy: BudgetPolicy,
) -> Budget:
    requested, source = requested_output(body)
    reserve = requested if requested is not None else default_reserve(context_window, policy)
    margin = max(policy.safety_min, math.ceil(context_window * policy.safety_ratio))
    if requested is not None and not policy.output_must_fit:
        reserve = lowered_output(requested, context_window - margin - prompt_tokens, context_window, policy)
        source = source if reserve == requested else f"{source}_lowered_by_the_server"
    return Budget(
        context_window=context_window,
        output_reserve=reserve,
        reserve_source=source,
        safety_margin=margin,
        input_budget=context_window - reserve - margin,
        prompt_tokens=prompt_tokens,
        pinned_tokens=pinned_tokens,
    )


def lowered_output(requested: int, room: int, context_window: int, policy: BudgetPolicy) -> int:
    """The output a server that lowers `max_tokens` will really leave: what was requested, or the
    `room` the prompt leaves in the window when that is less, but never below the policy's
    minimum output (nor above what was requested)."""
    floor = policy.min_output if policy.min_output is not None else default_reserve(context_window, policy)
    return min(requested, max(floor, room))
