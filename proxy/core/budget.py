"""The input budget: context window - output reserve - safety margin.

The output reserve is what the request itself asks for (`max_completion_tokens`, else
`max_tokens`) when it asks; otherwise a share of the window (15%) clamped to [500, 4096]. The
safety margin (5% of the window) absorbs the difference between our count and the provider's.
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

    def __post_init__(self) -> None:
        if not 0 <= self.reserve_ratio < 1 or not 0 <= self.safety_ratio < 1:
            raise ValueError("reserve_ratio and safety_ratio must be in [0, 1)")
        if self.reserve_min < 0 or self.reserve_max < self.reserve_min:
            raise ValueError("need 0 <= reserve_min <= reserve_max")
        if self.safety_min < 0 or self.constrained_below < 0:
            raise ValueError("safety_min and constrained_below must be >= 0")


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
    return Budget(
        context_window=context_window,
        output_reserve=reserve,
        reserve_source=source,
        safety_margin=margin,
        input_budget=context_window - reserve - margin,
        prompt_tokens=prompt_tokens,
        pinned_tokens=pinned_tokens,
    )
