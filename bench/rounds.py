"""Alternating rounds, and the spread of a ratio across them.

A ratio of two servers' figures taken at different moments of a shared machine says as much
about the moments as about the servers. So every target is measured in slices that alternate
(guard, bare, guard, bare... in a rotating order, round after round), each slice gives its own
figures, and each round gives its own ratio: the table prints the ratio of the pooled figures
with the least, median and greatest of the rounds' ratios beside it. A wide spread says the
machine moved under the run; the bare proxy's own spread is one of the checks that refuse
a run (bench/machine.py).

The CPU per request of a server comes from its own accounting (user + system time in
/proc/<pid>/stat, with its workers), read before and after each of its slices: unlike a rate,
it does not depend on what else got the cores meanwhile.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from bench.load import Connection, Target, rotated
from bench.processes import process_tree_cpu_seconds

T = TypeVar("T")


@dataclass(frozen=True)
class Spread:
    """The least, median and greatest of a figure over the rounds."""

    low: float
    median: float
    high: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread | None:
        finite = [v for v in values if v == v]  # NaN: a round with nothing to compare
        if not finite:
            return None
        return cls(min(finite), statistics.median(finite), max(finite))

    @property
    def relative(self) -> float:
        """(greatest - least) / median: 0.25 means the rounds ranged over a quarter of the median."""
        return (self.high - self.low) / self.median if self.median else float("inf")

    def as_list(self) -> list[float]:
        return [round(self.low, 4), round(self.median, 4), round(self.high, 4)]


def listed(spread: Spread | None) -> list[float] | None:
    """`spread` as a row of results.json holds it: [least, median, greatest], or None."""
    return spread.as_list() if spread is not None else None


def ratios(guard: Sequence[float], bare: Sequence[float]) -> list[float]:
    """Round by round, guard / bare (NaN where bare is 0)."""
    return [g / b if b else float("nan") for g, b in zip(guard, bare, strict=True)]


def chunks(values: Sequence[T], count: int) -> list[list[T]]:
    """`values` (in the order they were measured) cut into `count` consecutive rounds."""
    size = max(1, len(values) // count)
    return [list(values[i : i + size]) for i in range(0, size * count, size) if values[i : i + size]]


@dataclass(frozen=True)
class Slice:
    """One target's slice of one round: requests answered, seconds, CPU its processes spent."""

    requests: int
    seconds: float
    server_cpu_s: float | None
    client_cpu_s: float

    @property
    def rate(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0

    @property
    def server_cpu_ms(self) -> float:
        """CPU per request, in ms (NaN without a pid or a request)."""
        if self.server_cpu_s is None or not self.requests:
            return float("nan")
        return self.server_cpu_s * 1000 / self.requests


@dataclass(frozen=True)
class Throughput:
    """One target's closed-loop figures: each round's slice, and the pooled rate and CPU per
    request (a supervisor and its workers together; None without a pid) and this client's."""

    slices: tuple[Slice, ...]

    @property
    def requests(self) -> int:
        return sum(s.requests for s in self.slices)

    @property
    def rate(self) -> float:
        seconds = sum(s.seconds for s in self.slices)
        return self.requests / seconds if seconds else 0.0

    @property
    def server_cpu_ms(self) -> float | None:
        spent = [s.server_cpu_s for s in self.slices]
        if any(s is None for s in spent) or not self.requests:
            return None
        return sum(s for s in spent if s is not None) * 1000 / self.requests

    @property
    def client_cpu_ms(self) -> float:
        return sum(s.client_cpu_s for s in self.slices) * 1000 / max(1, self.requests)

    def rates(self) -> list[float]:
        return [s.rate for s in self.slices]

    def cpu_per_request(self) -> list[float]:
        return [s.server_cpu_ms for s in self.slices]


class Client(Protocol):
    """What `closed_loop` drives: one request at a time, the answer read whole."""

    async def post(self, request: Any) -> None: ...

    async def close(self) -> None: ...


async def closed_loop(
    targets: Sequence[Target],
    make_body: Callable[[], Any],
    clients: int,
    seconds: float,
    rounds: int,
    opener: Callable[[str], Awaitable[Client]] = Connection.open,
) -> dict[str, Throughput]:
    """`clients` in a closed loop, each target given `rounds` slices of `seconds`, the slices
    interleaved (the order rotating from round to round). Each client is opened by `opener`
    (by default one raw keep-alive connection, `Connection`) before the first slice and kept for
    all of them; `make_body` makes what its `post` takes."""
    connections = {t.name: [await opener(t.url) for _ in range(clients)] for t in targets}
    slices: dict[str, list[Slice]] = {t.name: [] for t in targets}
    try:
        for r in range(rounds):
            for target in rotated(targets, r):
                deadline = time.perf_counter() + seconds
                completed = [0]

                async def client(
                    connection: Client, deadline: float = deadline, completed: list[int] = completed
                ) -> None:
                    while time.perf_counter() < deadline:
                        await connection.post(make_body())
                        completed[0] += 1

                server_before = process_tree_cpu_seconds(target.pid) if target.pid else 0.0
                client_before, started = time.process_time(), time.perf_counter()
                await asyncio.gather(*(client(c) for c in connections[target.name]))
                elapsed = time.perf_counter() - started
                server = process_tree_cpu_seconds(target.pid) - server_before if target.pid else None
                slices[target.name].append(Slice(completed[0], elapsed, server, time.process_time() - client_before))
    finally:
        for opened in connections.values():
            for connection in opened:
                await connection.close()
    return {name: Throughput(tuple(taken)) for name, taken in slices.items()}


async def throughput(
    targets: Sequence[Target], make_body: Callable[[], bytes], clients: int, seconds: float, rounds: int
) -> dict[str, float]:
    """Requests per second with `clients` in a closed loop (see `closed_loop`)."""
    return {name: t.rate for name, t in (await closed_loop(targets, make_body, clients, seconds, rounds)).items()}
