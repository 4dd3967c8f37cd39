"""Learning how far an estimate is from the provider's own count, from `usage.prompt_tokens`.

A model whose tokenizer is unknown is counted with an estimate that errs high on purpose
(cl100k x1.6 for an unknown family), which wastes up to a third of a small window on English,
and can still err low on text the estimate was not measured on (CJK, digit-heavy JSON). Every
response says what the provider really counted; the ratio of that to our count, per upstream and
model, tells how to scale the estimate.

The ratio applied is a high quantile of the recent ratios, so one request that we undercounted
raises it at once, while lowering it takes `min_samples` observations and goes at most
`max_step` per observation: undercounts are corrected fast, overcounts loosened slowly and only
with evidence. It is bounded, and applied to estimates only: an exact tokenizer is never scaled.

Everything here is plain data: `Calibration` is a frozen value that `to_dict()`/`from_dict()`
turn into JSON-safe dicts, so it can live in any shared state store.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.core.counting.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class CalibrationPolicy:
    """How ratios become a factor. Defaults suit a window of a few thousand tokens and up."""

    quantile: float = 0.9  # of the recent ratios: high, so the worst recent undercount wins
    window: int = 32  # how many recent ratios are kept per upstream and model
    min_samples: int = 3  # observations needed before the factor may go down
    max_step: float = 0.25  # the most the factor falls per observation (a share of itself)
    min_factor: float = 0.25
    max_factor: float = 4.0
    headroom: float = 0.02  # added on top of the learned ratio, so a calibrated count errs high
    min_tokens: int = 64  # requests smaller than this are all framing: they teach nothing

    def __post_init__(self) -> None:
        if not 0.5 <= self.quantile <= 1.0:
            raise ValueError(f"calibration quantile must be between 0.5 and 1.0, not {self.quantile}")
        if self.window < 1:
            raise ValueError(f"calibration window must be at least 1, not {self.window}")
        if not 1 <= self.min_samples <= self.window:
            raise ValueError(f"calibration min_samples must be between 1 and the window ({self.window})")
        if not 0.0 < self.max_step < 1.0:
            raise ValueError(f"calibration max_step must be between 0 and 1, not {self.max_step}")
        if not 0.0 < self.min_factor <= 1.0 <= self.max_factor:
            raise ValueError("calibration bounds must satisfy 0 < min_factor <= 1 <= max_factor")
        if not 0.0 <= self.headroom < 0.5:
            raise ValueError(f"calibration headroom must be between 0 and 0.5, not {self.headroom}")
        if self.min_tokens < 1:
            raise ValueError(f"calibration min_tokens must be at least 1, not {self.min_tokens}")


@dataclass(frozen=True, slots=True)
class Calibration:
    """What one upstream and model taught so far: recent ratios and the factor they give."""

    factor: float = 1.0  # what estimates are multiplied by (headroom included)
    ratios: tuple[float, ...] = ()  # provider count / our unscaled count, oldest first
    observations: int = 0

    @property
    def learned(self) -> bool:
        return self.observations > 0

    def observe(self, provider_tokens: int, estimated_tokens: int, policy: CalibrationPolicy) -> Calibration:
        """This calibration after one response: `provider_tokens` is its `usage.prompt_tokens`,
        `estimated_tokens` our count of what was sent with the estimate *unscaled* (a count made
        with the calibrated tokenizer would feed the factor back into itself)."""
        if provider_tokens < policy.min_tokens or estimated_tokens < policy.min_tokens:
            return self
        ratios = (*self.ratios, provider_tokens / estimated_tokens)[-policy.window :]
        target = _bounded(quantile(ratios, policy.quantile) * (1 + policy.headroom), policy)
        latest = _bounded(ratios[-1] * (1 + policy.headroom), policy)
        factor = self.factor if self.learned else 1.0
        if latest > factor:
            factor = max(latest, target)  # an undercount is corrected at once, in full
        elif target > factor:
            factor = target
        elif len(ratios) >= policy.min_samples:
            factor = max(target, factor * (1 - policy.max_step))
        return Calibration(round(factor, 6), ratios, self.observations + 1)

    def to_dict(self) -> dict[str, Any]:
        return {"factor": self.factor, "ratios": [round(r, 6) for r in self.ratios], "observations": self.observations}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Calibration:
        """The inverse of `to_dict()`; ValueError for anything that is not one."""
        try:
            factor = float(data["factor"])
            ratios = tuple(float(r) for r in data.get("ratios", ()))
            observations = int(data.get("observations", len(ratios)))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"not a calibration: {exc}") from None
        if not math.isfinite(factor) or factor <= 0 or observations < 0 or any(r <= 0 for r in ratios):
            raise ValueError("not a calibration: factor and ratios must be positive")
        return cls(factor, ratios, observations)


def quantile(values: tuple[float, ...], q: float) -> float:
    """The `q` quantile of `values` by linear interpolation between closest ranks."""
    if not values:
        raise ValueError("quantile of no values")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _bounded(value: float, policy: CalibrationPolicy) -> float:
    return min(policy.max_factor, max(policy.min_factor, value))


@dataclass(frozen=True, slots=True)
class CalibratedTokenizer:
    """An estimate scaled by a learned factor. Never built around an exact tokenizer: use
    `calibrated()`, which returns an exact one unchanged."""

    base: Tokenizer
    factor: float

    @property
    def name(self) -> str:
        return f"{self.base.name}~{self.factor:.3g}"

    @property
    def identity(self) -> str:
        return f"{self.base.identity}~{self.factor!r}"

    @property
    def exact(self) -> bool:
        return False

    def count(self, text: str) -> int:
        n = self.base.count(text)
        return math.ceil(n * self.factor) if n else 0

    def count_many(self, texts: list[str]) -> list[int]:
        return [math.ceil(n * self.factor) if n else 0 for n in self.base.count_many(texts)]


def calibrated(tokenizer: Tokenizer, calibration: Calibration | None) -> Tokenizer:
    """`tokenizer` with `calibration` applied, when it is an estimate and something was learned."""
    if tokenizer.exact or calibration is None or not calibration.learned or calibration.factor == 1.0:
        return tokenizer
    return CalibratedTokenizer(tokenizer, calibration.factor)


@dataclass
class CalibrationTable:
    """Calibrations by (upstream, model), for a single process; a shared store holds the same
    dicts `to_dict()` gives. At most `max_entries` are kept, the least recently updated forgotten.
    `version` counts the observations: what was worked out from the table (a model's route) holds
    while it is unchanged, read without a call."""

    policy: CalibrationPolicy = field(default_factory=CalibrationPolicy)
    max_entries: int = 4096
    version: int = 0
    _entries: dict[tuple[str, str], Calibration] = field(default_factory=dict)

    def get(self, upstream: str, model: str) -> Calibration | None:
        return self._entries.get((upstream, model))

    def observe(self, upstream: str, model: str, provider_tokens: int, estimated_tokens: int) -> Calibration:
        key = (upstream, model)
        current = self._entries.pop(key, Calibration())
        updated = current.observe(provider_tokens, estimated_tokens, self.policy)
        self._entries[key] = updated
        self.version += 1
        while len(self._entries) > self.max_entries:
            del self._entries[next(iter(self._entries))]
        return updated

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {f"{upstream}\t{model}": c.to_dict() for (upstream, model), c in self._entries.items()}
