"""`make bench`: context-guard against the floor, measured side by side in one run.

Starts, each in its own process on 127.0.0.1 (bench/processes.py): a fake upstream
(bench/servers.py), a bare aiohttp pass-through proxy in front of it (the floor: read, forward,
stream back, nothing else), the minimal proxy (the bare one that also parses each body, logs a
line and observes a histogram: in the throughput slices only) and context-guard in front of it
(one worker; and with `--workers 2` too when `serve` has that flag). This process is the
client. Every scenario (bench/scenarios.py) sends to the targets interleaved or in alternating
rounds (bench/rounds.py), and reports context-guard as a ratio to the bare proxy measured in
the same slices of time, with the ratio's spread over the rounds. Then it runs the
single-threaded core figures (bench/core_speed.py) and, in a full run, the trimming quality
comparison (bench/trimming.py).

The machine is watched all along (bench/machine.py): a run on a machine too busy to measure is
printed with the reasons and refused: it writes no docs and exits non-zero (status 3; 0 with
`--force-print`). A run that passed writes bench/results.json and regenerates docs/benchmarks.md
and the README's figures from them (bench/publish.py, bench/report.py).

Run: python bench/run.py [--quick] [--no-docs] [--only S1,S2] [--force-print]
(--quick: about 3 minutes, fewer repetitions)
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT))

from bench import core_speed, load  # noqa: E402
from bench.machine import Watch, judge  # noqa: E402
from bench.processes import (  # noqa: E402, F401  # free_port, guard_config, started: imported from here by other scripts
    free_port,
    guard_command,
    guard_config,
    python,
    server_command,
    started,
    supports_workers,
    wait_ready,
)
from bench.publish import publish  # noqa: E402
from bench.rows import Plan, Row  # noqa: E402
from bench.scenarios import SCENARIOS, SSE_QUERY, servers_scenarios, start_rows  # noqa: E402, F401
from bench.throughput import bare_cpu_spread  # noqa: E402


def measure(plan: Plan, workers: bool, only: frozenset[str], watch: Watch) -> list[Row]:
    with tempfile.TemporaryDirectory() as folder:
        ports = {"upstream": free_port(), "bare": free_port(), "guard": free_port(), "minimal": free_port()}
        if workers:
            ports["guard_workers"] = free_port()
        upstream_url = f"http://127.0.0.1:{ports['upstream']}/v1"
        config = guard_config(Path(folder), ports["upstream"])
        commands = {
            "upstream": server_command("upstream", ports["upstream"]),
            "bare": server_command("bare", ports["bare"], upstream_url),
            "minimal": server_command("minimal", ports["minimal"], upstream_url),
            "guard": guard_command(config, ports["guard"]),
        }
        rows = []
        if "start" in only:
            rows += start_rows(plan, config)
            watch.scenario("start")
        if not only - {"start", "core"}:
            return rows
        with (
            started(commands["upstream"], ports["upstream"]) as (up, _),
            started(commands["bare"], ports["bare"]) as (bare, _),
            started(commands["minimal"], ports["minimal"]) as (minimal, _),
            started(commands["guard"], ports["guard"], "/readyz") as (guard, _),  # its vocabulary loaded
        ):
            pids = {"upstream": up.pid, "bare": bare.pid, "guard": guard.pid, "minimal": minimal.pid}
            if workers:
                workers_command = guard_command(config, ports["guard_workers"], 2)
                with started(workers_command, ports["guard_workers"], "/readyz") as (many, _):
                    pids["guard_workers"] = many.pid
                    rows += run_async(servers_scenarios(plan, ports, pids, workers, only, watch))
            else:
                rows += run_async(servers_scenarios(plan, ports, pids, workers, only, watch))
    return rows


def run_async(work: Awaitable[list[Row]]) -> list[Row]:
    async def main() -> list[Row]:
        return await work

    return asyncio.run(main())


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


def compile_sources() -> None:
    """Byte-compile context-guard's modules before anything starts, as `pip install` leaves an
    installed package (and as any run after the first finds them, unless PYTHONDONTWRITEBYTECODE
    is set, as it is on the machine these figures come from): the start scenario measures a start,
    not a compile of the tree's 15,000 lines. The third-party packages of both servers are
    compiled already (pip did it); the bare proxy is one script, which Python never reads from
    bytecode."""
    compileall.compile_dir(ROOT / "proxy", quiet=1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions: about 3 minutes")
    parser.add_argument("--no-docs", action="store_true", help="print and write results.json only")
    parser.add_argument(
        "--force-print", action="store_true", help="exit 0 when the machine was too busy (still no docs written)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench/results.json")
    parser.add_argument(
        "--only", default=",".join(SCENARIOS), help=f"comma-separated scenarios to run (of {', '.join(SCENARIOS)})"
    )
    args = parser.parse_args(argv)
    only = frozenset(args.only.split(","))
    if only - set(SCENARIOS):
        parser.error(f"unknown scenarios: {', '.join(sorted(only - set(SCENARIOS)))}")
    plan = Plan.of(args.quick)
    watch = Watch()
    watch.begin()  # the load average before anything of this run started
    compile_sources()
    began = time.perf_counter()
    workers = supports_workers() and "throughput" in only
    rows = measure(plan, workers, only, watch)
    if "core" in only:
        rows += core_speed.rows(core_speed.run(args.quick))
        watch.scenario("core")
    verdict = judge(watch, bare_cpu_spread(rows))
    results: dict[str, Any] = {
        "command": " ".join(["python bench/run.py", shlex.join(sys.argv[1:] if argv is None else argv)]).strip(),
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "seconds": round(time.perf_counter() - began),
        "workers_measured": workers,
        "machine_check": verdict.as_dict(),
        "machine_load": verdict.sentence(),
        "rows": rows,
        "trimming_quality": None if args.quick or not verdict.passed else trimming_quality(),
    }
    return publish(results, ROOT, args.out, docs=not args.no_docs, force_print=args.force_print)


if __name__ == "__main__":
    sys.exit(main())
