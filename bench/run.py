"""`make bench`: context-guard against the floor, measured side by side in one run.

Starts, each in its own process on 127.0.0.1: a fake upstream (bench/servers.py), a bare aiohttp
pass-through proxy in front of it (the floor: read, forward, stream back, nothing else) and
context-guard in front of it (one worker; and with `--workers 2` too when `serve` has that flag).
This process is the client. Every scenario sends to the targets interleaved, and reports
context-guard as a ratio to the bare proxy measured in the same slices of time. Then it runs the
single-threaded core figures (bench/core_speed.py) and, in a full run, the trimming quality
comparison (bench/trimming.py), prints one table, writes bench/results.json, and regenerates
docs/benchmarks.md and the README's figures from them (bench/report.py).

Run: python bench/run.py [--quick] [--no-docs]   (--quick: about 2 minutes, fewer repetitions)
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import functools
import os
import platform
import shlex
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT))

from bench import core_speed, load, report  # noqa: E402
from bench.load import SMALL, Bodies, Target, summary_ms  # noqa: E402
from bench.processes import stop  # noqa: E402

SSE_QUERY = "deltas=64&gap_ms=20"


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def guard_config(folder: Path, upstream_port: int) -> Path:
    """context-guard's config: everything at its defaults but the upstream, and the one model the
    benchmark sends named in a route, so its vocabulary (o200k_base) loads at start."""
    path = folder / "context-guard.yaml"
    path.write_text(
        "log:\n  format: json\n  level: info\nreadiness:\n  require_upstreams: false\n"
        f"upstreams:\n  fake:\n    base_url: http://127.0.0.1:{upstream_port}/v1\n"
        f"routes:\n  - match: {load.MODEL}\n    upstream: fake\n  - match: gpt-4o\n    upstream: fake\n"
    )
    return path


def python() -> list[str]:
    return [sys.executable]


def guard_command(config: Path, port: int, workers: int | None = None) -> list[str]:
    """`serve` with `workers` workers; one when None (and `serve` has the flag, whose default is
    every core: the one-worker figures must not get two by default)."""
    command = [*python(), "-m", "proxy", "serve", "--config", str(config), "--port", str(port)]
    if workers is None and supports_workers():
        workers = 1
    return [*command, "--workers", str(workers)] if workers else command


@functools.cache
def supports_workers() -> bool:
    out = subprocess.run([*python(), "-m", "proxy", "serve", "--help"], capture_output=True, text=True, cwd=ROOT)
    return "--workers" in out.stdout


def wait_ready(port: int, process: subprocess.Popen[bytes], timeout: float = 60, path: str = "/healthz") -> float:
    """Seconds from now until GET `path` answers 200 (polled every 5 ms)."""
    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        if process.poll() is not None:
            raise RuntimeError(f"{' '.join(map(str, process.args))} exited with {process.returncode}")  # type: ignore[arg-type]
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                if s.recv(32).startswith(b"HTTP/1.1 200"):
                    return time.perf_counter() - started
        except OSError:
            pass
        time.sleep(0.005)
    raise RuntimeError(f"port {port} did not come up in {timeout} s")


@contextmanager
def started(
    command: list[str], port: int, path: str = "/healthz", source: Path = ROOT
) -> Iterator[tuple[subprocess.Popen[bytes], float]]:
    """A server process run from the source tree `source`, answering 200 on `path`, and the seconds
    it took from exec; stopped after."""
    env = {**os.environ, "PYTHONPATH": str(source)}
    launched = time.perf_counter()
    process = subprocess.Popen(command, cwd=source, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, process, path=path)
        yield process, time.perf_counter() - launched
    finally:
        stop(process)


Row = dict[str, Any]


def row(scenario: str, metric: str, bare: float | None, guard: float, unit: str, **extra: Any) -> Row:
    """One line of the table: context-guard's figure, the bare proxy's, and their ratio."""
    ratio = guard / bare if bare else None
    return {"scenario": scenario, "metric": metric, "bare": bare, "guard": guard, "unit": unit, "ratio": ratio, **extra}


def added(times: dict[str, list[float]], name: str, q: str) -> float:
    """The quantile `q`, in ms, of what a proxy added to each request: its latency less the
    upstream's own for the same body, sent moments apart (quantiles of two separate
    distributions cannot be subtracted: their tails fall on different requests)."""
    return summary_ms([p - u for p, u in zip(times[name], times["upstream"], strict=True)])[q]


SCENARIOS = ("start", "memory", "latency", "throughput", "streaming", "isolation", "core")


async def servers_scenarios(
    plan: Plan, ports: dict[str, int], pids: dict[str, int], workers: bool, only: frozenset[str]
) -> list[Row]:
    targets = {name: Target(name, f"http://127.0.0.1:{port}/v1", pid=pids[name]) for name, port in ports.items()}
    for target in targets.values():
        await target.open()
    upstream, bare, guard = targets["upstream"], targets["bare"], targets["guard"]
    rows: list[Row] = []
    try:
        # Memory first: no earlier scenario's high-water mark (10 MB bodies) hides what requests retain.
        if "memory" in only:
            rows += await memory_rows(plan, bare, guard)
        if "latency" in only:
            rows += await latency_rows(plan, [upstream, bare, guard])
        if "throughput" in only:
            rows += await throughput_rows(plan, targets, workers)
        if "streaming" in only:
            rows += await streaming_rows(plan, [upstream, bare, guard])
        if "isolation" in only:
            rows += await isolation_rows(plan, bare, guard)
    finally:
        for target in targets.values():
            await target.close()
    return rows


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
                        upstream_ms=summary_ms(times["upstream"])[q],
                        target="<= 1.15x" if mode == "warm" else None,
                        n=n,
                    )
                )
    return rows


async def throughput_rows(plan: Plan, targets: dict[str, Target], workers: bool) -> list[Row]:
    """Requests per second at 32 clients. With `workers`, two workers against one, and the CPU
    each spent per request: on a machine whose cores the client and the upstream share, the rate
    says what the machine gave, the CPU per request whether a second worker costs more."""
    bodies = Bodies.of_size(88_000)
    measured = [targets["bare"], targets["guard"], *([targets["guard_workers"]] if workers else [])]
    for t in measured:
        await t.post(bodies.base)
    rows = []
    for mode, make in (("cold", bodies.cold), ("warm", bodies.warm)):
        got = await load.closed_loop(measured, make, 32, plan.throughput_seconds, plan.throughput_rounds)
        scenario = f"throughput, 32 clients, 88 KB {mode}"
        client_ms = {name: round(t.client_cpu_ms, 3) for name, t in got.items()}
        rows.append(
            row(
                scenario,
                "req/s, one worker",
                got["bare"].rate,
                got["guard"].rate,
                "req/s",
                target=">= 0.85x" if mode == "warm" else None,
                client_cpu_ms_per_request=client_ms,
            )
        )
        if workers:
            one, two = got["guard"], got["guard_workers"]
            rows.append(row(scenario, "req/s, 2 workers vs 1", one.rate, two.rate, "req/s", target=">= 1.6x"))
            if one.server_cpu_ms is not None and two.server_cpu_ms is not None:
                cpu = (one.server_cpu_ms, two.server_cpu_ms)
                rows.append(row(scenario, "CPU per request, 2 workers vs 1", *cpu, "ms"))
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

    rows = [
        row(
            "SSE, 64 deltas 20 ms apart",
            metric,
            measure("bare") - measure("upstream"),
            measure("guard") - measure("upstream"),
            "ms",
            target=target,
        )
        for metric, measure, target in (
            ("added time to first byte p50", first_byte_ms, "<= 1.25x"),
            ("added inter-chunk gap p99", gap_p99_ms, "guard < 0.2 ms"),
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
                [*python(), str(ROOT / "bench/servers.py"), "bare", str(port), "http://127.0.0.1:9/v1"]
                if name == "bare"
                else guard_command(config, port)
            )
            with started(command, port) as (process, seconds):
                times[name].append(seconds)
                ready[name].append(seconds + (wait_ready(port, process, path="/readyz") if name == "guard" else 0))
                time.sleep(0.5)
                idle[name].append(load.rss_mb(process.pid))
    return [
        row("start", metric, min(figures["bare"]), min(figures["guard"]), unit, target=target)
        for metric, figures, unit, target in (
            ("cold start (exec to first 200)", times, "s", "guard < 1 s"),
            ("cold start (exec to ready: vocabulary loaded)", ready, "s", None),
            ("idle RSS, only o200k models configured", idle, "MB", "guard < 90 MB"),
        )
    ]


def core_rows(figures: dict[str, Any]) -> list[Row]:
    c, t = figures["counting"], figures["trim_heavy"]
    scenario = f"counting, {c['tokens']:,} tokens in {c['messages']:,} messages ({c['text_mb']:.1f} MB of text)"
    trim_scenario = (
        f"trim-heavy, {t['tokens_before']:,} tokens / {t['messages']:,} messages to a {t['window']:,} window"
    )
    return [
        {
            "scenario": scenario,
            "metric": "cold throughput vs encode_ordinary, one thread each",
            "bare": c["raw_encode_s"],
            "guard": c["cold_one_thread_s"],
            "unit": "s",
            "ratio": c["cold_ratio"],
            "ratio_meaning": "throughput",
            "target": ">= 0.8x",
        },
        {
            "scenario": scenario,
            "metric": "encode pool's gain over one thread (cold)",
            "bare": c["cold_one_thread_s"],
            "guard": c["cold_pool_s"],
            "unit": "s",
            "ratio": c["pool_gain"],
            "ratio_meaning": "speedup",
        },
        {
            "scenario": scenario,
            "metric": "warm (one new turn) vs cold, one thread",
            "bare": c["cold_one_thread_s"],
            "guard": c["warm_s"],
            "unit": "s",
            "ratio": c["warm_speedup"],
            "ratio_meaning": "speedup",
        },
        *(
            {
                "scenario": trim_scenario,
                "metric": phase,
                "bare": None,
                "guard": t[f"{phase}_ms"],
                "unit": "ms",
                "ratio": None,
            }
            for phase in ("parse", "count", "decide", "serialise")
        ),
    ]


def trimming_quality() -> str:
    """bench/trimming.py's output: context-guard's cuts against litellm's and LangChain's (about 4 minutes)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [*python(), str(ROOT / "bench/trimming.py")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800
    )
    return out.stdout.strip() if out.returncode == 0 else f"bench/trimming.py failed: {out.stderr.strip()[-500:]}"


def machine() -> str:
    import aiohttp
    import tiktoken

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (
        f"{load.cpu_count()} cores, {memory:.0f} GiB, {platform.platform(terse=True)}, "
        f"Python {platform.python_version()}, aiohttp {aiohttp.__version__}, tiktoken {tiktoken.__version__}"
    )


def measure(plan: Plan, workers: bool, only: frozenset[str]) -> list[Row]:
    with tempfile.TemporaryDirectory() as folder:
        ports = {"upstream": free_port(), "bare": free_port(), "guard": free_port()}
        if workers:
            ports["guard_workers"] = free_port()
        upstream_url = f"http://127.0.0.1:{ports['upstream']}/v1"
        config = guard_config(Path(folder), ports["upstream"])
        commands = {
            "upstream": [*python(), str(ROOT / "bench/servers.py"), "upstream", str(ports["upstream"])],
            "bare": [*python(), str(ROOT / "bench/servers.py"), "bare", str(ports["bare"]), upstream_url],
            "guard": guard_command(config, ports["guard"]),
        }
        rows = start_rows(plan, config) if "start" in only else []
        if not only - {"start", "core"}:
            return rows
        with (
            started(commands["upstream"], ports["upstream"]) as (up, _),
            started(commands["bare"], ports["bare"]) as (bare, _),
            started(commands["guard"], ports["guard"], "/readyz") as (guard, _),  # its vocabulary loaded
        ):
            pids = {"upstream": up.pid, "bare": bare.pid, "guard": guard.pid}
            if workers:
                workers_command = guard_command(config, ports["guard_workers"], 2)
                with started(workers_command, ports["guard_workers"], "/readyz") as (many, _):
                    pids["guard_workers"] = many.pid
                    rows += run_async(servers_scenarios(plan, ports, pids, workers, only))
            else:
                rows += run_async(servers_scenarios(plan, ports, pids, workers, only))
    return rows


def run_async(work: Awaitable[list[Row]]) -> list[Row]:
    async def main() -> list[Row]:
        return await work

    return asyncio.run(main())


def compile_sources() -> None:
    """Byte-compile context-guard's modules before anything starts, as `pip install` leaves an
    installed package (and as any run after the first finds them, unless PYTHONDONTWRITEBYTECODE
    is set, as it is on the machine these figures come from): the start scenario measures a start,
    not a compile of the tree's 15,000 lines. The third-party packages of both servers are
    compiled already (pip did it); the bare proxy is one script, which Python never reads from
    bytecode."""
    compileall.compile_dir(ROOT / "proxy", quiet=1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions: about 2 minutes")
    parser.add_argument("--no-docs", action="store_true", help="print and write results.json only")
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results.json")
    parser.add_argument(
        "--only", default=",".join(SCENARIOS), help=f"comma-separated scenarios to run (of {', '.join(SCENARIOS)})"
    )
    args = parser.parse_args(argv)
    only = frozenset(args.only.split(","))
    if only - set(SCENARIOS):
        parser.error(f"unknown scenarios: {', '.join(sorted(only - set(SCENARIOS)))}")
    plan = Plan.of(args.quick)
    compile_sources()
    began = time.perf_counter()
    workers = supports_workers() and "throughput" in only
    rows = measure(plan, workers, only)
    if "core" in only:
        rows += core_rows(core_speed.run(args.quick))
    results = {
        "command": " ".join(["python bench/run.py", shlex.join(sys.argv[1:] if argv is None else argv)]).strip(),
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "seconds": round(time.perf_counter() - began),
        "workers_measured": workers,
        "rows": rows,
        "trimming_quality": None if args.quick else trimming_quality(),
    }
    report.write_json(results, args.out)
    print(report.table(results))
    if not args.no_docs:
        report.write_docs(results, ROOT)


if __name__ == "__main__":
    main()
