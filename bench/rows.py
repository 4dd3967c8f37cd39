"""A line of the benchmark's table, and how many repetitions each scenario gets: shared by the
scenarios (bench/scenarios.py) and the throughput measures (bench/throughput.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.rounds import Spread, listed


@dataclass(frozen=True)
class Plan:
    """How many repetitions each scenario gets."""

    latency_small: int
    latency_large: int
    throughput_seconds: float
    throughput_rounds: int
    streams_alone: int
    streams_concurrent: int
    isolation: tuple[int, int]  # rounds, and large bodies answered in each round's loaded phase
    memory_requests: tuple[int, int]
    cold_starts: int

    @classmethod
    def of(cls, quick: bool) -> Plan:
        if quick:
            return cls(30, 4, 1.5, 2, 3, 100, (2, 2), (1_000, 3_000), 1)
        return cls(300, 40, 5.0, 4, 20, 500, (3, 4), (1_000, 20_000), 3)


Row = dict[str, Any]


def row(
    scenario: str,
    metric: str,
    bare: float | None,
    guard: float,
    unit: str,
    spread: Spread | None = None,
    **extra: Any,
) -> Row:
    """One line of the table: context-guard's figure, the bare proxy's, their ratio, and the
    least / median / greatest of the ratio over the scenario's rounds (`spread`)."""
    ratio = guard / bare if bare else None
    return {
        "scenario": scenario,
        "metric": metric,
        "bare": bare,
        "guard": guard,
        "unit": unit,
        "ratio": ratio,
        "spread": listed(spread),
        **extra,
    }
