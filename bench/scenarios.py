"""The scenarios of `make bench`: each one's measure, and its rows of the table.

Every scenario sends to the targets interleaved (request by request, or in alternating slices:
bench/rounds.py) and reports context-guard as a ratio to the bare proxy measured in the same
slices of time, with the spread of that ratio over the scenario's rounds where it has rounds.
bench/run.py starts the servers and runs these; bench/publish.py decides what is written. The
throughput scenario's measures are bench/throughput.py's; a line of the table is bench/rows.py's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from bench import load
from bench.load import SMALL, Bodies, Target, summary_ms
from bench.machine import Watch
from bench.processes import free_port, guard_command, server_command, started, wait_ready
from bench.rounds import Spread, chunks, ratios
from bench.rows import Plan, Row, row
from bench.throughput import throughput_rows

SSE_QUERY = "deltas=64&gap_ms=20"
SCENARIOS = ("start", "memory", "latency", "throughput", "streaming", "isolation", "core")


def added_spread(times: dict[str, list[float]], q: str, rounds: int) -> Spread | None:
    """The spread of the guard's added `q` over the bare proxy's, per round of consecutive bodies."""
    per_round = []
    for part in zip(*(chunks(times[n], rounds) for n in ("upstream", "bare", "guard")), strict=True):
        split = dict(zip(("upstream", "bare", "guard"), part, strict=True))
        bare = added(split, "bare", q)
        per_round.append(added(split, "guard", q) / bare if bare > 0 else float("nan"))
    return Spread.of(per_round)


def gap_spread(timings: dict[str, list[load.StreamTiming]], rounds: int) -> Spread | None:
    """The spread of the guard's added p99 inter-chunk gap over the bare proxy's, per round of
    consecutive streams (each proxy's p99 less the upstream's, as the row's own figure)."""
    per_round = []
    for part in zip(*(chunks(timings[n], rounds) for n in ("upstream", "bare", "guard")), strict=True):
        p99 = {
            name: load.percentile([gap for timing in streams for gap in timing.gaps], 0.99)
            for name, streams in zip(("upstream", "bare", "guard"), part, strict=True)
        }
        bare = p99["bare"] - p99["upstream"]
        per_round.append((p99["guard"] - p99["upstream"]) / bare if bare > 0 else float("nan"))
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
    rounds = min(LATENCY_ROUNDS, plan.streams_alone)
    first_spread = added_spread(first, "p50", rounds)

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
            ("added inter-chunk gap p99", gap_p99_ms, "guard < 0.2 ms", gap_spread(timings, rounds)),
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
