"""The throughput scenario of `make bench`: 32 clients in a closed loop, each target given
alternating slices of time (bench/rounds.py), with raw keep-alive clients (the proxy's own
capacity) and SDK-like ones (what an application sees); the rate and the CPU per request of each
server against the bare proxy's, two workers against one, and the minimal proxy beside them."""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from bench.load import Bodies, HttpxClient, SdkClient, Target
from bench.rounds import Client, Spread, Throughput, closed_loop, listed, ratios
from bench.rows import Plan, Row, row


async def throughput_rows(plan: Plan, targets: dict[str, Target], workers: bool) -> list[Row]:
    """Requests per second at 32 clients, and the CPU each server's processes spent per request,
    in alternating slices (bench/rounds.py): cold bodies, the warm conversation re-sent as it was
    (`same body`) and re-sent with a new turn. With `workers`, two workers against one: on a
    machine whose cores the client and the upstream share, the rate says what the machine gave,
    the CPU per request whether a second worker costs more."""
    bodies = Bodies.of_size(88_000)
    minimal = [targets["minimal"]] if "minimal" in targets else []
    measured = [targets["bare"], targets["guard"], *minimal, *([targets["guard_workers"]] if workers else [])]
    for t in measured:
        await t.post(bodies.base)
    rows = []
    modes = (("cold", bodies.cold), ("warm, new turn", bodies.warm), ("warm, same body", lambda: bodies.base))
    for mode, make in modes:
        got = await closed_loop(measured, make, 32, plan.throughput_seconds, plan.throughput_rounds)
        scenario = f"throughput, 32 clients, 88 KB {mode}"
        aims = (">= 0.7x", "<= 1.5x") if mode != "cold" else (None, None)
        bare_spread = listed(Spread.of(got["bare"].cpu_per_request()))  # the floor, for bench/machine.py
        rows += rate_and_cpu_rows(scenario, got, "bare", "guard", aims, bare_cpu_ms_spread=bare_spread)
        if minimal:
            rows += minimal_rows(scenario, got)
        if workers:
            one, two = got["guard"], got["guard_workers"]
            rows.append(
                row(
                    scenario,
                    "req/s, 2 workers vs 1",
                    one.rate,
                    two.rate,
                    "req/s",
                    Spread.of(ratios(two.rates(), one.rates())),
                    target=">= 1.6x",
                )
            )
            rows += cpu_row(scenario, "CPU per request, 2 workers vs 1", one, two)
    return rows + await sdk_throughput_rows(plan, targets["bare"], targets["guard"], bodies)


def minimal_rows(scenario: str, got: dict[str, Throughput]) -> list[Row]:
    """What any guard of this design costs before its own work (bench/servers.py `minimal`: the
    bare proxy that also parses the body, writes a log line and observes a histogram): its CPU
    per request against the bare proxy's, and context-guard's against it, all three measured in
    the same alternating slices."""
    bare, minimal, guard = got["bare"], got["minimal"], got["guard"]
    if None in (bare.server_cpu_ms, minimal.server_cpu_ms, guard.server_cpu_ms):
        return []
    return [
        *cpu_row(
            scenario,
            "CPU per request: the minimal proxy (parse, log line, histogram), not context-guard",
            bare,
            minimal,
        ),
        *cpu_row(
            scenario, "CPU per request: context-guard against the minimal proxy (baseline column)", minimal, guard
        ),
    ]


# The SDK-like clients (bench/load.py): the official openai SDK, and an SDK's transport alone.
SDK_CLIENTS: tuple[tuple[str, Callable[[str], Awaitable[Client]]], ...] = (
    ("openai SDK", SdkClient.open),
    ("httpx JSON", HttpxClient.open),
)


async def sdk_throughput_rows(plan: Plan, bare: Target, guard: Target, bodies: Bodies) -> list[Row]:
    """Requests per second at 32 SDK-like clients, the warm conversation with a new turn and as
    it was, in alternating slices. The clients' own work per request (building the JSON from
    objects, httpx, parsing the answer) runs on the cores the servers use: the rate an
    application sees, where the raw client's says what the proxy can do."""
    rows = []
    modes = (("warm, new turn", bodies.warm_request), ("warm, same body", lambda: bodies.conversation))
    for (kind, opener), (mode, make) in itertools.product(SDK_CLIENTS, modes):
        got = await closed_loop([bare, guard], make, 32, plan.throughput_seconds, plan.throughput_rounds, opener=opener)
        scenario = f"throughput, 32 {kind} clients, 88 KB {mode}"
        rows += rate_and_cpu_rows(scenario, got, bare.name, guard.name, (">= 0.9x", None))
    return rows


def rate_and_cpu_rows(
    scenario: str,
    got: dict[str, Throughput],
    bare: str,
    guard: str,
    targets: tuple[str | None, str | None],
    **cpu_extra: Any,
) -> list[Row]:
    """A throughput measure's two rows, the guard against the bare proxy (`got`'s, by name):
    requests per second, and the CPU the servers' processes spent per request (when known;
    `cpu_extra` goes with it). `targets`: the rate's and the CPU's."""
    plain, guarded = got[bare], got[guard]
    clients = {name: round(t.client_cpu_ms, 3) for name, t in got.items()}
    rate_spread = Spread.of(ratios(guarded.rates(), plain.rates()))
    rate = row(scenario, "req/s, one worker", plain.rate, guarded.rate, "req/s", rate_spread, target=targets[0])
    rows = [{**rate, "client_cpu_ms_per_request": clients, "rounds": len(guarded.slices)}]
    metric = "CPU per request (server processes' own accounting)"
    return rows + cpu_row(scenario, metric, plain, guarded, target=targets[1], **cpu_extra)


def cpu_row(scenario: str, metric: str, base: Throughput, other: Throughput, **extra: Any) -> list[Row]:
    """The CPU `other`'s processes spent per request against `base`'s (in the baseline column),
    with the spread of the ratio over the rounds; no row when either is not known."""
    if base.server_cpu_ms is None or other.server_cpu_ms is None:
        return []
    spread = Spread.of(ratios(other.cpu_per_request(), base.cpu_per_request()))
    return [row(scenario, metric, base.server_cpu_ms, other.server_cpu_ms, "ms", spread, **extra)]


def bare_cpu_spread(rows: Sequence[Row]) -> float | None:
    """The widest relative range of the bare proxy's own CPU per request over the throughput
    rounds of any mode (bench/machine.py's check of the floor); None without those rows."""
    spreads = [r["bare_cpu_ms_spread"] for r in rows if r.get("bare_cpu_ms_spread")]
    if not spreads:
        return None
    return max((high - low) / median for low, median, high in spreads if median)
