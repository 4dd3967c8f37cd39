"""Whether the machine was quiet enough to measure on, and what its load was.

A published figure must be one that a rerun on the same machine gives again. On a shared
machine another job's CPU goes unnoticed in a ratio taken at one moment, and a run taken while
the machine was several times busier once put figures in the README that nobody could
reproduce. So the benchmark watches the machine and refuses to publish a run that was not quiet:

- **before**: the 1-minute load average with the benchmark's servers started and idle must be
  at most `LOAD_BEFORE_MAX` (1.5 runnable tasks: on a 2-core machine, more than half of it
  busy with something else);
- **during**: the CPU that processes other than the benchmark's own (this process, the servers
  it started and their children) used, from /proc/stat's user + nice + system + steal time less
  the benchmark's processes' own accounting, must average at most `OTHER_CORES_MAX` (0.3 of a
  core) over the measured scenarios. Interrupt time is left out of both: loopback traffic is
  served in softirq, which no process is charged for;
- **the floor itself**: the bare proxy's CPU per request across the throughput rounds may range
  over at most `BARE_SPREAD_MAX` (25%) of its median: the floor moved, so every ratio to it did.

A refused run prints why and writes no docs (bench/publish.py); the docs of a passed run state
its load (`Verdict.sentence`).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.processes import process_tree_cpu_seconds

LOAD_BEFORE_MAX = 1.5
OTHER_CORES_MAX = 0.3
BARE_SPREAD_MAX = 0.25
_BUSY_FIELDS = (0, 1, 2, 7)  # of /proc/stat's cpu line: user, nice, system, steal (guest is in user)


def load_average() -> float:
    """The 1-minute load average."""
    return float(Path("/proc/loadavg").read_text().split()[0])


def busy_seconds() -> float:
    """CPU seconds all cores spent busy (user, nice, system, steal) since boot."""
    values = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    return sum(int(values[i]) for i in _BUSY_FIELDS if i < len(values)) / os.sysconf("SC_CLK_TCK")


def ours_seconds() -> float:
    """CPU seconds of this process, its live children (the servers, their workers) and those reaped."""
    return process_tree_cpu_seconds(os.getpid(), children_reaped=True)


@dataclass(frozen=True)
class Sample:
    at: float
    busy: float
    ours: float

    @classmethod
    def now(cls) -> Sample:
        return cls(time.monotonic(), busy_seconds(), ours_seconds())

    def other_cores_since(self, earlier: Sample) -> float:
        """Cores' worth of CPU that processes other than the benchmark's used between the two."""
        elapsed = self.at - earlier.at
        return max(0.0, (self.busy - earlier.busy) - (self.ours - earlier.ours)) / elapsed if elapsed > 0 else 0.0


@dataclass
class Watch:
    """The machine's load over a run: the load average before it, then, per scenario, the cores
    other processes used while it ran."""

    load_before: float = field(default_factory=load_average)
    scenarios: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    _last: Sample = field(default_factory=Sample.now)

    def begin(self) -> None:
        """Scenarios measured from now (the servers started)."""
        self.load_before = load_average()
        self._last = Sample.now()

    def scenario(self, name: str) -> None:
        """Scenario `name` has just ended: the load since the last mark is its."""
        now = Sample.now()
        self.scenarios[name] = now.other_cores_since(self._last)
        self.seconds[name] = now.at - self._last.at
        self._last = now

    def other_cores(self) -> float:
        """Time-weighted mean over the scenarios measured."""
        total = sum(self.seconds.values())
        return sum(self.scenarios[n] * self.seconds[n] for n in self.scenarios) / total if total else 0.0


@dataclass(frozen=True)
class Verdict:
    passed: bool
    reasons: tuple[str, ...]
    load_before: float
    other_cores: float
    other_cores_by_scenario: dict[str, float]
    bare_cpu_spread: float | None  # relative: (greatest - least) / median of its rounds

    def sentence(self) -> str:
        """The machine's load during the run, for the docs' header and the printed table."""
        spread = (
            ""
            if self.bare_cpu_spread is None
            else (
                f"; the bare proxy's CPU per request ranged over {self.bare_cpu_spread:.0%} of its median across rounds"
            )
        )
        worst = max(self.other_cores_by_scenario.items(), key=lambda kv: kv[1], default=None)
        peak = f" (at most {worst[1]:.2f}, in {worst[0]})" if worst else ""
        verdict = "passed" if self.passed else "REFUSED: " + "; ".join(self.reasons)
        return (
            f"Machine load: 1-minute load average {self.load_before:.2f} before the run with the servers idle; "
            f"other processes used {self.other_cores:.2f} cores on average while it ran{peak}{spread}. "
            f"Quiet-machine check (load before <= {LOAD_BEFORE_MAX}, other processes <= {OTHER_CORES_MAX} cores, "
            f"bare proxy's spread <= {BARE_SPREAD_MAX:.0%}): {verdict}."
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def judge(watch: Watch, bare_cpu_spread: float | None) -> Verdict:
    """Whether the run was quiet enough to publish, and why not."""
    reasons = []
    if watch.load_before > LOAD_BEFORE_MAX:
        before = watch.load_before
        reasons.append(f"the 1-minute load average was {before:.2f} before the run (bound {LOAD_BEFORE_MAX})")
    other = watch.other_cores()
    if other > OTHER_CORES_MAX:
        reasons.append(f"other processes used {other:.2f} cores on average during the run (bound {OTHER_CORES_MAX})")
    if bare_cpu_spread is not None and bare_cpu_spread > BARE_SPREAD_MAX:
        reasons.append(
            f"the bare proxy's CPU per request ranged over {bare_cpu_spread:.0%} of its median across rounds "
            f"(bound {BARE_SPREAD_MAX:.0%})"
        )
    by_scenario = {name: round(cores, 3) for name, cores in watch.scenarios.items()}
    return Verdict(not reasons, tuple(reasons), watch.load_before, round(other, 3), by_scenario, bare_cpu_spread)
