"""What holds the guard's event loop: a cold vocabulary's first request, and a flood of bodies.

Two phases of bench/load_hardening.py, each through a real `context-guard serve --workers 1` in
front of the suite's fake upstream on 127.0.0.1. The `/livez` prober and every attacker run in
processes of their own (bench/hardening_clients.py), so what the prober measures is the guard,
not a loop it shares with the attack; the guard's own loop-lag histogram
(`context_guard_event_loop_lag_seconds`, read from `/metrics` before and after) says how long its
loop was held.

- `cold`: one request for each model family whose vocabulary the guard had not loaded, one after
  another: `/livez` while each is served, the guard's loop lag over it, and the resident memory
  its vocabulary added (the price of loading it at start instead).
- `flood`: sixteen gzip uploads inflating to 31 MiB (sixteen keys) and a hundred clients sending
  2 MB and hanging up, all at once: `/livez` p50/p99/max over the attack, the guard's loop lag,
  its peak resident memory (VmHWM, reset after warming) against the documented bound
  (`HELD_BYTES_FACTOR` x `server.body_memory_bytes` over idle; the Kubernetes limit for the
  process whole), repeated on a fresh guard each time, the machine's load printed.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT))

from bench.processes import free_port, stop  # noqa: E402
from bench.proxy_overhead import rss_mb, wait_ready  # noqa: E402
from proxy.config.settings import ServerSettings  # noqa: E402
from tests.support.memory_bounds import HELD_BYTES_FACTOR  # noqa: E402

CLIENTS = [sys.executable, str(ROOT / "bench" / "hardening_clients.py")]
FAKE_UPSTREAM = (
    "import sys; from aiohttp import web; from tests.support.upstream import FakeUpstream; "
    "web.run_app(FakeUpstream().app(), host='127.0.0.1', port=int(sys.argv[1]), print=None, access_log=None)"
)
MiB = 1024 * 1024
POD_LIMIT_MIB = 832  # deploy/kubernetes/deployment.yaml
LAG_BUCKET = re.compile(r'^context_guard_event_loop_lag_seconds_bucket\{le="([^"]+)"\} (\S+)$', re.MULTILINE)
LAG_MAX = re.compile(r"^context_guard_event_loop_lag_max_seconds (\S+)$", re.MULTILINE)
BUSY_MAX = re.compile(r"^context_guard_event_loop_busy_max_seconds (\S+)$", re.MULTILINE)
# One model a family whose vocabulary is its own (the model map's families, proxy.core.models).
COLD_MODELS = (
    ("gpt-4o", "tiktoken o200k_base"),
    ("gpt-4-0613", "tiktoken cl100k_base"),
    ("claude-3-5-sonnet-20241022", "bound over cl100k_base"),
    ("gemini-2.5-flash", "vocab gemma3"),
    ("gemini-3.1-pro-preview", "vocab gemma4"),
    ("llama-3.1-8b-instruct", "vocab llama3"),
    ("qwen3-8b", "vocab qwen"),
    ("mistral-nemo", "vocab tekken"),
    ("deepseek-v3", "vocab deepseek-v3"),
)


@dataclass
class Guard:
    process: subprocess.Popen[bytes]
    port: int

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@asynccontextmanager
async def upstream_and_guard(workdir: Path, extra: str = "") -> AsyncIterator[Guard]:
    """The fake upstream and a guard with the default limits in front of it (`extra`: more of its
    YAML config), ready (its vocabularies loaded at start); both stopped after."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    up_port, port = free_port(), free_port()
    upstream = subprocess.Popen([sys.executable, "-c", FAKE_UPSTREAM, str(up_port)], cwd=ROOT, env=env)
    config = workdir / "guard.yaml"
    config.write_text(
        f"upstreams:\n  fake:\n    base_url: http://127.0.0.1:{up_port}/v1\n    kind: generic\nlog:\n  format: json\n"
        + extra
    )
    command = [sys.executable, "-m", "proxy", "serve", "--workers", "1", "--port", str(port), "--config", str(config)]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await wait_ready(f"http://127.0.0.1:{up_port}/healthz")
        guard = Guard(process, port)
        await until_ready(guard)
        yield guard
    finally:
        stop(process)
        stop(upstream)


async def until_ready(guard: Guard) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(600):
            try:
                async with session.get(guard.url("/readyz")) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientConnectionError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError("the guard did not get ready")


async def chat(guard: Guard, model: str, text: str = "warm up") -> int:
    body = {"model": model, "messages": [{"role": "user", "content": text}]}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session,
        session.post(guard.url("/v1/chat/completions"), json=body) as r,
    ):
        await r.read()
        return r.status


async def loop_lag(guard: Guard) -> tuple[dict[float, float], float, float]:
    """The guard's loop-lag histogram (cumulative count by bucket bound), its recent maximum and
    the most CPU its loop spent between two ticks lately."""
    async with aiohttp.ClientSession() as session, session.get(guard.url("/metrics")) as r:
        text = await r.text()
    buckets = {float(le): float(count) for le, count in LAG_BUCKET.findall(text)}
    late, busy = LAG_MAX.search(text), BUSY_MAX.search(text)
    return buckets, float(late.group(1)) if late else float("nan"), float(busy.group(1)) if busy else float("nan")


def main_thread_schedule(pid: int) -> tuple[float, float]:
    """The guard's event-loop thread (its main thread): seconds on a CPU, and seconds runnable but
    waiting for one (Linux's schedstat); what the machine's other work took from the loop."""
    cpu, waited, _ = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()
    return int(cpu) / 1e9, int(waited) / 1e9


def lag_over(before: dict[float, float], after: dict[float, float]) -> tuple[float, int]:
    """From two readings of the histogram: the bound of the highest bucket a tick fell in between
    them (the loop's longest stall, at most this) and how many ticks were 100 ms late or more."""
    if not after:
        return float("nan"), 0
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]  # cumulative
    highest = next((bounds[i] for i in range(len(bounds)) if counts[i] == counts[-1]), float("inf"))
    below_100ms = max((counts[i] for i, b in enumerate(bounds) if b < 0.1), default=0.0)
    return highest, int(counts[-1] - below_100ms)


class Prober:
    """bench/hardening_clients.py's prober in its own process."""

    def __init__(self, port: int) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.process = subprocess.Popen(
            [*CLIENTS, "prober", str(port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env
        )

    def samples(self) -> list[tuple[float, float | None]]:
        out, _ = self.process.communicate(timeout=30)
        return [(sent, ms) for sent, ms in json.loads(out)]


def attacker(*argv: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([*CLIENTS, *argv], stdout=subprocess.PIPE, env=env)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def within(samples: list[tuple[float, float | None]], start: float, end: float) -> tuple[list[float], int]:
    """The answered probes sent in [start, end] (milliseconds) and how many went unanswered."""
    taken = [ms for sent, ms in samples if start <= sent <= end]
    return [ms for ms in taken if ms is not None], sum(ms is None for ms in taken)


def megabytes(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class FirstRequest:
    """One model's first request on a guard: its status, `/livez`'s slowest answer while it was
    served, the guard's loop lag over it (the histogram's bucket) and the memory it added."""

    status: int
    livez_max: float
    lost: int
    lag_bucket: float
    grown_mb: float


async def cold(workdir: Path) -> tuple[list[str], list[str]]:
    """The first request of each family's model, one after another on one guard, with
    `tokenizers.preload` left `auto` and set to `all`: the text for bench/hardening.md and the
    table for docs/security.md."""
    lines, idle, seen = [], {}, {}
    for preload in ("auto", "all"):
        async with upstream_and_guard(workdir, f"tokenizers:\n  preload: {preload}\n") as guard:
            idle[preload] = rss_mb(guard.process.pid)
            seen[preload] = await first_requests(guard)
        lines += [
            f"tokenizers.preload: {preload} (a generic upstream); resident memory once ready: {idle[preload]:.0f} MB. "
            "The first request of each family's model, one after another:",
            f"  {'model':<28} {'vocabulary':<24} {'status':>6} {'/livez max':>12} {'loop lag <=':>11} {'+RSS MB':>8}",
        ]
        for model, vocabulary in COLD_MODELS:
            r = seen[preload][model]
            worst = f"{r.livez_max:.0f} ms" + (f" ({r.lost} lost)" if r.lost else "")
            lines.append(
                f"  {model:<28} {vocabulary:<24} {r.status:>6} {worst:>12} {r.lag_bucket * 1000:>8.0f} ms "
                f"{r.grown_mb:>8.0f}"
            )
    table = [
        f"Resident memory once ready: {idle['auto']:.0f} MB with `auto`, {idle['all']:.0f} MB with `all` "
        f"({time.strftime('%Y-%m-%d', time.gmtime())}, load average {os.getloadavg()[0]:.1f}).",
        "",
        "| first request of | vocabulary | `auto`: /livez slowest | `auto`: loop lag (bucket) | memory it added "
        "| `all`: /livez slowest | `all`: loop lag (bucket) |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for model, vocabulary in COLD_MODELS:
        auto, every = seen["auto"][model], seen["all"][model]
        table.append(
            f"| {model} | {vocabulary} | {auto.livez_max:.0f} ms | <= {auto.lag_bucket * 1000:.0f} ms | "
            f"{auto.grown_mb:.0f} MB | {every.livez_max:.0f} ms | <= {every.lag_bucket * 1000:.0f} ms |"
        )
    return lines, table


async def first_requests(guard: Guard) -> dict[str, FirstRequest]:
    spans: list[tuple[str, int, float, float, float, float]] = []
    prober = Prober(guard.port)
    await asyncio.sleep(1.0)
    for model, _ in COLD_MODELS:
        before, *_ = await loop_lag(guard)
        rss = rss_mb(guard.process.pid)
        started = time.time()
        status = await chat(guard, model)
        await asyncio.sleep(0.3)  # probes sent while the loop was held are answered after it
        after, *_ = await loop_lag(guard)
        highest, _ = lag_over(before, after)
        spans.append((model, status, started, time.time(), highest, rss_mb(guard.process.pid) - rss))
    samples = prober.samples()
    found = {}
    for model, status, started, ended, highest, grown in spans:
        answered, missed = within(samples, started, ended)
        found[model] = FirstRequest(status, max(answered, default=float("nan")), missed, highest, grown)
    return found


async def flood_once(workdir: Path, uploads: int, hung: int) -> dict[str, Any]:
    budget_mib = ServerSettings().body_memory[0] / MiB
    async with upstream_and_guard(workdir) as guard:
        pid = guard.process.pid
        assert await chat(guard, "gpt-4o") == 200
        idle = megabytes(pid, "VmRSS")
        open_before = len(os.listdir(f"/proc/{pid}/fd"))
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM from here: the attack's peak
        before, *_ = await loop_lag(guard)
        prober = Prober(guard.port)
        await asyncio.sleep(1.0)
        schedule = main_thread_schedule(pid)
        attackers = [
            attacker("inflating", str(guard.port), str(uploads), str(31 * MiB)),
            attacker("hung_up", str(guard.port), str(hung), str(2_000_000)),
        ]
        reports = [json.loads((await asyncio.to_thread(a.communicate, timeout=300))[0]) for a in attackers]
        cpu, waited = (b - a for a, b in zip(schedule, main_thread_schedule(pid), strict=True))
        released = time.perf_counter()
        while len(os.listdir(f"/proc/{pid}/fd")) > open_before and time.perf_counter() - released < 10:
            await asyncio.sleep(0.05)
        released_s = time.perf_counter() - released
        after, recent, busy = await loop_lag(guard)
        samples = prober.samples()
        peak = megabytes(pid, "VmHWM")
        descriptors_after = len(os.listdir(f"/proc/{pid}/fd"))
    start, end = min(r["started"] for r in reports), max(r["ended"] for r in reports) + 0.5
    answered, missed = within(samples, start, end)
    highest, late = lag_over(before, after)
    statuses = reports[0]["statuses"]
    return {
        "livez": answered, "missed": missed, "lag_bucket": highest, "lag_recent_max": recent, "late_ticks": late,
        "busy": busy, "loop_cpu": cpu, "loop_waited": waited,
        "idle": idle, "peak": peak, "bound": HELD_BYTES_FACTOR * budget_mib, "seconds": end - start,
        "statuses": {s: statuses.count(s) for s in sorted(set(statuses))}, "sent_whole": reports[1]["sent_whole"],
        "descriptors": (open_before, descriptors_after, released_s), "load": os.getloadavg()[0],
    }  # fmt: skip


async def flood(workdir: Path, repeats: int, uploads: int = 16, hung: int = 100) -> tuple[list[str], list[str]]:
    """The attack `repeats` times, each on a fresh guard: the text for bench/hardening.md and the
    table for docs/security.md."""
    table = [
        f"Measured {time.strftime('%Y-%m-%d', time.gmtime())}: {uploads} gzip uploads inflating to 31 MiB (a key each) "
        f"and {hung} clients sending 2 MB and hanging up, at once, against a fresh guard each run.",
        "",
        "| run | load average | /livez p50 / p99 / slowest | lost | guard's loop lag, largest | its own work "
        "between two ticks, largest | its loop thread waiting for a core | RSS idle → peak (growth / bound) "
        "| uploads answered |",
        "|---:|---:|---|---:|---:|---:|---:|---|---|",
    ]
    lines = [
        f"{uploads} gzip uploads inflating to 31 MiB (one key each) + {hung} clients sending 2 MB and hanging up, "
        "at once; /livez asked every 10 ms on a new connection from a process of its own:",
        f"  {'run':>3} {'load':>4} | {'/livez p50':>10} {'p99':>6} {'max':>6} {'lost':>4} | {'loop lag':>8} "
        f"{'busy':>6} {'loop CPU':>8} {'no core':>8} | {'idle':>4} {'peak':>4} {'growth/bound MB':>15} | "
        "uploads answered         | fds back",
    ]
    for run in range(1, repeats + 1):
        r = await flood_once(workdir, uploads, hung)
        opened, closed, seconds = r["descriptors"]
        lines.append(
            f"  {run:>3} {r['load']:>4.1f} | {pct(r['livez'], 0.5):>7.1f} ms {pct(r['livez'], 0.99):>3.0f} ms "
            f"{max(r['livez'], default=float('nan')):>3.0f} ms {r['missed']:>4} | "
            f"{r['lag_recent_max'] * 1000:>5.0f} ms "
            f"{r['busy'] * 1000:>3.0f} ms {r['loop_cpu'] * 1000:>5.0f} ms {r['loop_waited'] * 1000:>5.0f} ms | "
            f"{r['idle']:>4.0f} {r['peak']:>4.0f} {r['peak'] - r['idle']:>7.0f}/{r['bound']:<7.0f} | "
            f"{json.dumps(r['statuses']):<24} | {closed}/{opened} in {seconds:.1f} s"
        )
        print(lines[-1], flush=True)
        table.append(
            f"| {run} | {r['load']:.1f} | {pct(r['livez'], 0.5):.0f} / {pct(r['livez'], 0.99):.0f} / "
            f"{max(r['livez'], default=float('nan')):.0f} ms | {r['missed']} | {r['lag_recent_max'] * 1000:.0f} ms | "
            f"{r['busy'] * 1000:.0f} ms | {r['loop_waited'] * 1000:.0f} ms of {r['seconds']:.1f} s | "
            f"{r['idle']:.0f} → {r['peak']:.0f} MB ({r['peak'] - r['idle']:.0f} / {r['bound']:.0f}) | "
            f"{', '.join(f'{n} x {s}' for s, n in r['statuses'].items())} |"
        )
    lines += [
        "  loop lag: the guard's own `context_guard_event_loop_lag_max_seconds` (how late its loop ran a tick",
        "  due every 20 ms); busy: `..._busy_max_seconds` (the most CPU the loop spent between two ticks: its own",
        "  work); loop CPU and no core: its loop thread's CPU over the attack and the time it was runnable with no",
        "  core free (schedstat);",
        f"  growth/bound: peak minus idle RSS (MB) against {HELD_BYTES_FACTOR:g} x server.body_memory_bytes; the pod "
        f"limit is {POD_LIMIT_MIB} MiB whole.",
    ]
    return lines, table
