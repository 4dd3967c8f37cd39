"""The scenarios of `make bench`: each one's measure, and its rows of the table.

Every scenario sends to the targets interleaved (request by request, or in alternating slices:
bench/rounds.py) and reports context-guard as a ratio to the bare proxy measured in the same
slices of time, with the spread of that ratio over the scenario's rounds where it has rounds.
bench/run.py starts the servers and runs these; bench/publish.py decides what is written.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench import load
from bench.load import SMALL, Bodies, HttpxClient, SdkClient, Target, summary_ms
from bench.machine import Watch
from bench.processes import free_port, guard_command, server_command, started, wait_ready
from bench.rounds import Client, Spread, Throughput, chunks, closed_loop, ratios

SSE_QUERY = "deltas=64&gap_ms=20"
SCENARIOS = ("start", "memory", "latency", "throughput", "streaming", "isolation", "core")


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
        "spread": spread.as_list() if spread else None,
        **extra,
    }


def added_spread(times: dict[str, list[float]], q: str, rounds: int) -> Spread | None:
    """The spread of the guard's added `q` over the bare proxy's, per round of consecutive bodies."""
    per_round = []
    for part in zip(*(chunks(times[n], rounds) for n in ("upstream", "bare", "guard")), strict=True):
        split = dict(zip(("upstream", "bare", "guard"), part, strict=True))
        bare = added(split, "bare", q)
        per_round.append(added(split, "guard", q) / bare if bare > 0 else float("nan"))
    return Spread.of(per_round)


def added(times: dict[str, list[float]], name: str, q: str) -> float:
    """The quantile `q`, in ms, of what a proxy added to each request: its latency less the
    upstream's own for the same body, sent moments apart (quantiles of two separate
    distributions cannot be subtracted: their tails fall on different requests)."""
    return summary_ms([p - u for p, u in zip(times[name], times["upstream"], strict=True)])[q]


async def servers_scenarios(
    plan: Plan, ports: dict[str, int], pids: dict[str, int], workers: bool, only: frozenset[str], watch: Watch
) -> list[Row]:
    """The scenarios that need the servers, in order; `watch` marks the end of each."""
    targets = {name: Target(name, f"http://127.0.0.1:{port}/v1", pid=pids[name]) for name, port in ports.items()}
    for target in targets.values():
        await target.open()
    upstream, bare, guard = targets["upstream"], targets["bare"], targets["guard"]
    # Memory first: no earlier scenario's high-water mark (10 MB bodies) hides what requests retain.
    steps: dict[str, Callable[[], Awaitable[list[Row]]]] = {
        "memory": lambda: memory_rows(plan, bare, guard),
        "latency": lambda: latency_rows(plan, [upstream, bare, guard]),
        "throughput": lambda: throughput_rows(plan, targets, workers),
        "streaming": lambda: streaming_rows(plan, [upstream, bare, guard]),
        "isolation": lambda: isolation_rows(plan, bare, guard),
    }
    rows: list[Row] = []
    try:
        for name, step in steps.items():
            if name in only:
                rows += await step()
                watch.scenario(name)
    finally:
        for target in targets.values():
            await target.close()
    return rows


LATENCY_ROUNDS = 4  # the bodies of a latency measure, cut into this many rounds for the spread


async def latency_rows(plan: Plan, targets: list[Target]) -> list[Row]:
    rows = []
    for label, size, n in (("25 KB", 25_000, plan.latency_small), ("1 MB", 1_000_000, plan.latency_large)):
        bodies = Bodies.of_size(size)
        for mode, make in (("cold", bodies.cold), ("warm", bodies.warm)):
            # Connections open, and the warm conversation seen once just before it is re-sent (the
            # cold bodies sent before it may have pushed it out of the guard's bounded caches).
            for t in targets:
                await t.post(bodies.base)
            times = await load.latency(targets, make, n)
            for q in ("p50", "p99"):
                rows.append(
                    row(
                        f"added latency, 1 in flight, {label} {mode}",
                        f"added {q}",
                        added(times, "bare", q),
                        added(times, "guard", q),
                        "ms",
                        added_spread(times, q, LATENCY_ROUNDS),
                        upstream_ms=summary_ms(times["upstream"])[q],
                        target="<= 1.15x" if mode == "warm" else None,
                        n=n,
                    )
                )
    return rows


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
        bare_spread = _as_list(Spread.of(got["bare"].cpu_per_request()))  # the floor, for bench/machine.py
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
            if one.server_cpu_ms is not None and two.server_cpu_ms is not None:
                cpu = (one.server_cpu_ms, two.server_cpu_ms)
                spread = Spread.of(ratios(two.cpu_per_request(), one.cpu_per_request()))
                rows.append(row(scenario, "CPU per request, 2 workers vs 1", *cpu, "ms", spread))
    return rows + await sdk_throughput_rows(plan, targets["bare"], targets["guard"], bodies)


def minimal_rows(scenario: str, got: dict[str, Throughput]) -> list[Row]:
    """What any guard of this design costs before its own work (bench/servers.py `minimal`: the
    bare proxy that also parses the body, writes a log line and observes a histogram): its CPU
    per request against the bare proxy's, and context-guard's against it, all three measured in
    the same alternating slices."""
    bare, minimal, guard = got["bare"], got["minimal"], got["guard"]
    if bare.server_cpu_ms is None or minimal.server_cpu_ms is None or guard.server_cpu_ms is None:
        return []
    return [
        row(
            scenario,
            "CPU per request: the minimal proxy (parse, log line, histogram), not context-guard",
            bare.server_cpu_ms,
            minimal.server_cpu_ms,
            "ms",
            Spread.of(ratios(minimal.cpu_per_request(), bare.cpu_per_request())),
        ),
        row(
            scenario,
            "CPU per request: context-guard against the minimal proxy (baseline column)",
            minimal.server_cpu_ms,
            guard.server_cpu_ms,
            "ms",
            Spread.of(ratios(guard.cpu_per_request(), minimal.cpu_per_request())),
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
    if plain.server_cpu_ms is not None and guarded.server_cpu_ms is not None:
        cpu_spread = Spread.of(ratios(guarded.cpu_per_request(), plain.cpu_per_request()))
        figures = (plain.server_cpu_ms, guarded.server_cpu_ms, "ms", cpu_spread)
        rows.append(
            row(
                scenario, "CPU per request (server processes' own accounting)", *figures, target=targets[1], **cpu_extra
            )
        )
    return rows


def _as_list(spread: Spread | None) -> list[float] | None:
    return spread.as_list() if spread else None


def bare_cpu_spread(rows: Sequence[Row]) -> float | None:
    """The widest relative range of the bare proxy's own CPU per request over the throughput
    rounds of any mode (bench/machine.py's check of the floor); None without those rows."""
    spreads = [r["bare_cpu_ms_spread"] for r in rows if r.get("bare_cpu_ms_spread")]
    if not spreads:
        return None
    return max((high - low) / median for low, median, high in spreads if median)


async def streaming_rows(plan: Plan, targets: list[Target]) -> list[Row]:
    payload = Bodies.of_size(2_000, stream=True).base
    timings: dict[str, list[load.StreamTiming]] = {t.name: [] for t in targets}
    for i in range(plan.streams_alone):
        for target in load.rotated(targets, i):
            timings[target.name].append(await load.stream_once(target, payload, SSE_QUERY))

    def first_byte_ms(name: str) -> float:
        return summary_ms([t.first_byte for t in timings[name]])["p50"]

    def gap_p99_ms(name: str) -> float:
        return load.percentile([g for t in timings[name] for g in t.gaps], 0.99) * 1000

    first = {name: [t.first_byte for t in values] for name, values in timings.items()}
    first_spread = added_spread(first, "p50", min(LATENCY_ROUNDS, plan.streams_alone))

    rows = [
        row(
            "SSE, 64 deltas 20 ms apart",
            metric,
            measure("bare") - measure("upstream"),
            measure("guard") - measure("upstream"),
            "ms",
            spread,
            target=target,
        )
        for metric, measure, target, spread in (
            ("added time to first byte p50", first_byte_ms, "<= 1.25x", first_spread),
            ("added inter-chunk gap p99", gap_p99_ms, "guard < 0.2 ms", None),
        )
    ]
    many = {t.name: await load.streams(t, payload, SSE_QUERY, plan.streams_concurrent) for t in targets[1:]}
    rows.append(
        row(
            f"SSE, {plan.streams_concurrent} concurrent streams",
            "seconds for all (ideal 1.26)",
            many["bare"]["seconds"],
            many["guard"]["seconds"],
            "s",
            completed=many["guard"]["completed"],
            guard_gap_max_ms=many["guard"]["gap_max_ms"],
            bare_gap_max_ms=many["bare"]["gap_max_ms"],
            target=f"all {plan.streams_concurrent} complete",
        )
    )
    return rows


async def isolation_rows(plan: Plan, bare: Target, guard: Target) -> list[Row]:
    """Small-request p99 while 10 MB bodies are counted, against its value alone. Each round
    measures, per target, small requests under whole large bodies (upload to answer), then as
    many small requests alone (a p99 of the same number of samples); rounds rotate the targets.
    The large bodies come from another process, so that this one's loop only times small ones.
    The ratio is that of the rounds' pooled p99s; each round's own ratio is listed too."""
    rounds, bodies = plan.isolation
    targets = (bare, guard)
    for target in targets:  # connections open, the small body seen once
        for _ in range(10):
            await target.post(SMALL)
    alone: dict[str, list[float]] = {t.name: [] for t in targets}
    loaded: dict[str, list[float]] = {t.name: [] for t in targets}
    per_round: dict[str, list[float]] = {t.name: [] for t in targets}
    for r in range(rounds):
        for target in load.rotated(targets, r):
            under = await load.small_latency_while(target, 10_000_000, bodies)
            quiet = await load.small_latency(target, len(under))
            loaded[target.name] += under
            alone[target.name] += quiet
            per_round[target.name].append(summary_ms(under)["p99"] / summary_ms(quiet)["p99"])
    p99 = {name: {"alone": summary_ms(alone[name])["p99"], "loaded": summary_ms(loaded[name])["p99"]} for name in alone}
    return [
        row(
            "isolation, small requests while 10 MB bodies are counted",
            "small p99 loaded / alone",
            p99["bare"]["loaded"] / p99["bare"]["alone"],
            p99["guard"]["loaded"] / p99["guard"]["alone"],
            "x",
            Spread.of(ratios(per_round["guard"], per_round["bare"])),
            guard_alone_ms=p99["guard"]["alone"],
            guard_loaded_ms=p99["guard"]["loaded"],
            guard_round_ratios=[round(x, 2) for x in per_round["guard"]],
            bare_round_ratios=[round(x, 2) for x in per_round["bare"]],
            n=len(alone["guard"]),
            target="guard <= 2x",
        )
    ]


async def memory_rows(plan: Plan, bare: Target, guard: Target) -> list[Row]:
    bodies = Bodies.of_size(25_000)
    first, second = plan.memory_requests
    rss: dict[str, list[float]] = {}
    for target in (bare, guard):
        assert target.pid is not None
        sent = 0
        rss[target.name] = []
        for goal in (first, second):
            while sent < goal:
                batch = min(64, goal - sent)
                await asyncio.gather(*(target.post(bodies.cold()) for _ in range(batch)))
                sent += batch
            rss[target.name].append(load.rss_mb(target.pid))
    rows = [
        row(
            "memory",
            f"RSS after {first:,} requests (25 KB, cold)",
            rss["bare"][0],
            rss["guard"][0],
            "MB",
        ),
        row(
            "memory",
            f"RSS after {second:,} / after {first:,}",
            rss["bare"][1] / rss["bare"][0],
            rss["guard"][1] / rss["guard"][0],
            "x",
            target="guard <= 1.10x",
        ),
    ]
    peaks: dict[str, float] = {}
    for target in (bare, guard):
        assert target.pid is not None
        peak, _ = await load.peak_rss_during(target.pid, lambda t=target: t.post(SMALL, "bytes=100000000"))
        peaks[target.name] = peak
    rows.append(row("memory", "peak RSS while streaming a 100 MB response", peaks["bare"], peaks["guard"], "MB"))
    return rows


def start_rows(plan: Plan, config: Path) -> list[Row]:
    """Cold start (exec to first 200 on /healthz) and idle RSS, each server started afresh."""
    times: dict[str, list[float]] = {"bare": [], "guard": []}
    ready: dict[str, list[float]] = {"bare": [], "guard": []}  # the bare proxy is ready when it answers
    idle: dict[str, list[float]] = {"bare": [], "guard": []}
    for _ in range(plan.cold_starts):
        for name in ("bare", "guard"):
            port = free_port()
            command = (
                server_command("bare", port, "http://127.0.0.1:9/v1") if name == "bare" else guard_command(config, port)
            )
            with started(command, port) as (process, seconds):
                times[name].append(seconds)
                ready[name].append(seconds + (wait_ready(port, process, path="/readyz") if name == "guard" else 0))
                time.sleep(0.5)
                idle[name].append(load.rss_mb(process.pid))
    return [
        row(
            "start",
            metric,
            min(figures["bare"]),
            min(figures["guard"]),
            unit,
            Spread.of(ratios(figures["guard"], figures["bare"])) if len(figures["guard"]) > 1 else None,
            target=target,
        )
        for metric, figures, unit, target in (
            ("cold start (exec to first 200)", times, "s", "guard < 1 s"),
            ("cold start (exec to ready: vocabulary loaded)", ready, "s", None),
            ("idle RSS, only o200k models configured", idle, "MB", "guard < 90 MB"),
        )
    ]
