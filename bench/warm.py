"""The warm scenarios of `make bench` alone, with context-guard from one or more checkouts side by side.

For measuring a change to the hot path: the fake upstream, the bare proxy and context-guard from
each named source tree (one worker each) all run at once, and every scenario sends to them
interleaved, so "before" and "after" are ratios to the same bare proxy in the same slices of time.
Scenarios: warm added latency at one request in flight (25 KB), warm throughput at 32 clients
(88 KB, with a new turn, then sent again as it was) with each proxy's CPU time per request served
per slice (the least / median / greatest of the rounds' ratios beside each) (user + system, from /proc: less noisy
than a rate on a shared machine, where the rate also depends on what else gets the cores), and
added time to the first byte of an SSE answer (64 deltas 20 ms apart).

With `--fill S`, every guard is first sent cold 25 KB bodies for S seconds, so that its caches are
full, as `make bench`'s earlier scenarios leave them.

Run: python bench/warm.py --guard before=/tmp/base --guard after=. [--rounds 4] [--seconds 3] [--fill 8]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT))

from bench import load, rounds  # noqa: E402
from bench.load import Bodies, Target, summary_ms  # noqa: E402
from bench.processes import free_port, guard_config, python, started  # noqa: E402
from bench.scenarios import SSE_QUERY  # noqa: E402


def _spread(guard: list[float], bare: list[float]) -> str:
    spread = rounds.Spread.of(rounds.ratios(guard, bare))
    return "-" if spread is None else f"{spread.low:.2f}/{spread.median:.2f}/{spread.high:.2f}"


def added_ms(times: dict[str, list[float]], name: str, q: str) -> float:
    return summary_ms([p - u for p, u in zip(times[name], times["upstream"], strict=True)])[q]


async def scenarios(
    targets: dict[str, Target], guards: list[str], pids: dict[str, int], args: argparse.Namespace
) -> None:
    for target in targets.values():
        await target.open()
    every = list(targets.values())
    try:
        if args.fill:  # as `make bench`'s cold scenarios leave them: the guards' caches full
            cold = Bodies.of_size(25_000)
            await rounds.throughput([targets[g] for g in guards], cold.cold, 16, args.fill, 1)
        small = Bodies.of_size(25_000)
        for t in every:
            await t.post(small.base)
        times = await load.latency(every, small.warm, args.latency)
        for q in ("p50", "p99"):
            bare = added_ms(times, "bare", q)
            cells = "  ".join(f"{g} {added_ms(times, g, q):.3f} ({added_ms(times, g, q) / bare:.2f}x)" for g in guards)
            print(f"added latency 25 KB warm {q}: bare {bare:.3f} ms  {cells}", flush=True)

        bodies = Bodies.of_size(88_000)
        measured = [targets["bare"], *(targets[g] for g in guards)]
        for t in measured:
            await t.post(bodies.base)
        for label, make in (("new turn", bodies.warm), ("same body", lambda: bodies.base)):
            for t in measured:
                t.pid = pids[t.name]
            got = await rounds.closed_loop(measured, make, 32, args.seconds, args.rounds)
            bare = got["bare"]
            cells = "  ".join(
                f"{g} {got[g].rate:.0f} ({got[g].rate / bare.rate:.2f}x, "
                f"rounds {_spread(got[g].rates(), bare.rates())})"
                for g in guards
            )
            print(f"throughput 32 clients 88 KB {label}: bare {bare.rate:.0f} req/s  {cells}", flush=True)
            cells = "  ".join(
                f"{g} {got[g].server_cpu_ms:.2f} ({got[g].server_cpu_ms / bare.server_cpu_ms:.2f}x, "
                f"rounds {_spread(got[g].cpu_per_request(), bare.cpu_per_request())})"
                for g in guards
            )
            print(f"CPU per request, same slices: bare {bare.server_cpu_ms:.2f} ms  {cells}", flush=True)

        payload = Bodies.of_size(2_000, stream=True).base
        first: dict[str, list[float]] = {t.name: [] for t in every}
        for i in range(args.streams):
            for target in load.rotated(every, i):
                first[target.name].append((await load.stream_once(target, payload, SSE_QUERY)).first_byte)
        median = {name: summary_ms(values)["p50"] for name, values in first.items()}
        bare = median["bare"] - median["upstream"]
        cells = "  ".join(
            f"{g} {median[g] - median['upstream']:.3f} ({(median[g] - median['upstream']) / bare:.2f}x)" for g in guards
        )
        print(f"SSE added time to first byte p50: bare {bare:.3f} ms  {cells}", flush=True)
    finally:
        for target in every:
            await target.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--guard", action="append", required=True, help="NAME=SOURCE_TREE (repeatable)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--latency", type=int, default=200)
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument(
        "--fill", type=float, default=0.0, help="first send cold 25 KB bodies for this many seconds (caches full)"
    )
    args = parser.parse_args()
    sources = {name: Path(tree).resolve() for name, tree in (g.split("=", 1) for g in args.guard)}
    began = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder, ExitStack() as stack:
        ports = {"upstream": free_port(), "bare": free_port(), **{name: free_port() for name in sources}}
        upstream_url = f"http://127.0.0.1:{ports['upstream']}/v1"
        config = guard_config(Path(folder), ports["upstream"])
        servers = str(ROOT / "bench/servers.py")
        stack.enter_context(started([*python(), servers, "upstream", str(ports["upstream"])], ports["upstream"]))
        bare, _ = stack.enter_context(
            started([*python(), servers, "bare", str(ports["bare"]), upstream_url], ports["bare"])
        )
        pids = {"bare": bare.pid}
        for name, source in sources.items():
            command = [*python(), "-m", "proxy", "serve", "--config", str(config), "--port", str(ports[name])]
            guard, _ = stack.enter_context(started([*command, "--workers", "1"], ports[name], "/readyz", source))
            pids[name] = guard.pid
        targets = {name: Target(name, f"http://127.0.0.1:{port}/v1") for name, port in ports.items()}
        asyncio.run(scenarios(targets, list(sources), pids, args))
    print(f"({time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
