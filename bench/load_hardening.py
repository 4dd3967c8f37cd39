"""Load check for the hardening work: many slow streams at once, then many model names.

Two phases through a real `context-guard serve` process to a fake upstream process, both on
127.0.0.1 (this process is the client):

1. `--streams` (600) concurrent streamed chat requests, each of which the upstream trickles out
   over `--stream-seconds` (5 s); every stream must arrive whole (all its parts, then `[DONE]`).
   This needs the upstream pool (`server.upstream_connections`, 1024 by default) to hold them all.
2. `--requests` (10,000) chat requests, each naming a model never seen before, sized to be cut
   to the fallback window so that every per-model metric is touched; every answer must be 200
   and name the model asked for. `/metrics` size and the proxy's resident memory are sampled at
   every fifth of the run and reported as flat or growing (bounding the model label is separate work).

Run: python bench/load_hardening.py [--streams N] [--stream-seconds S] [--requests N] [--concurrency C]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT))

from bench.processes import free_port, stop  # noqa: E402
from bench.proxy_overhead import rss_mb, serve_proxy, wait_ready  # noqa: E402

SLOW_UPSTREAM = (
    "import sys; from aiohttp import web; from tests.support.upstream import FakeUpstream; "
    "fake = FakeUpstream(stream_chunks=int(sys.argv[2]), chunk_delay=float(sys.argv[3])); "
    "web.run_app(fake.app(), host='127.0.0.1', port=int(sys.argv[1]), print=None, access_log=None, backlog=4096)"
)
PARTS = 20


def over_budget_conversation() -> list[dict[str, str]]:
    """About 9,000 tokens: over the 8,192-token fallback window's budget, so every request is cut."""
    turn = "Explain, step by step and with examples, how a reverse proxy decides where to send a request. " * 9
    messages = [{"role": "system", "content": "You are a patient tutor."}]
    for i in range(40):
        messages += [{"role": "user", "content": f"Q{i}: {turn}"}, {"role": "assistant", "content": f"A{i}: {turn}"}]
    return [*messages, {"role": "user", "content": "Thanks. One more: what is a 503?"}]


async def slow_streams(base: str, streams: int) -> tuple[int, float]:
    body = json.dumps({"model": "gpt-4o", "stream": True, "messages": [{"role": "user", "content": "Tell me slowly."}]})
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one() -> bool:
            async with session.post(
                f"{base}/chat/completions", data=body, headers={"Content-Type": "application/json"}
            ) as r:
                text = (await r.read()).decode()
            return (
                r.status == 200 and all(f"part{i} " in text for i in range(PARTS)) and text.endswith("data: [DONE]\n\n")
            )

        started = time.perf_counter()
        results = await asyncio.gather(*(one() for _ in range(streams)), return_exceptions=True)
        return sum(result is True for result in results), time.perf_counter() - started


async def many_models(base: str, metrics_url: str, requests: int, concurrency: int, pid: int) -> dict[str, Any]:
    messages = over_budget_conversation()
    limit = asyncio.Semaphore(concurrency)
    samples: list[tuple[int, int, float]] = []  # (requests done, /metrics bytes, RSS MB)
    ok = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

        async def sample(done: int) -> None:
            async with session.get(metrics_url) as r:
                samples.append((done, len(await r.read()), rss_mb(pid)))

        async def one() -> bool:
            model = f"team-model-{uuid.uuid4().hex[:12]}"
            payload = json.dumps({"model": model, "messages": messages})
            async with (
                limit,
                session.post(
                    f"{base}/chat/completions", data=payload, headers={"Content-Type": "application/json"}
                ) as r,
            ):
                answer = await r.json()
                return (
                    r.status == 200
                    and answer.get("model") == model
                    and r.headers.get("x-context-guard-removed", "0") != "0"
                )

        await sample(0)
        fifth = max(1, requests // 5)
        started = time.perf_counter()
        for done in range(0, requests, fifth):
            batch = min(fifth, requests - done)
            ok += sum(await asyncio.gather(*(one() for _ in range(batch))))
            await sample(done + batch)
        elapsed = time.perf_counter() - started
    return {"ok": ok, "samples": samples, "seconds": elapsed}


def trend(values: list[float]) -> str:
    """Flat when the last sample is within 10% of the one after the first fifth (warm-up excluded)."""
    base, last = values[1], values[-1]
    growth = (last - base) / base if base else 0.0
    return f"{'flat' if growth <= 0.10 else 'GROWING'} ({growth:+.0%} from the first fifth to the end)"


def markdown(lines: list[str], load: float) -> str:
    """The docs/benchmarks.md section of this run (`make bench` pulls bench/hardening.md in)."""
    body = "\n".join(lines)
    return (
        "## Hardening load check (`bench/load_hardening.py`)\n\n"
        "A real `context-guard serve --workers 1` in front of a fake upstream, both on 127.0.0.1, this\n"
        f"machine's two cores shared with other work (load average {load:.1f} at the end). Written by\n"
        "`python bench/load_hardening.py --markdown bench/hardening.md`.\n\n"
        f"```\n{body}\n```\n\n"
        "The `model` label of every metric is a configured or known model name, or `other`, so `/metrics`\n"
        "stays the same size however many names clients invent.\n"
    )


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=600)
    parser.add_argument("--stream-seconds", type=float, default=5.0)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--markdown", help="also write the docs section to this file (bench/hardening.md)")
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()

    up_port, proxy_port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    chunk_delay = args.stream_seconds / PARTS
    upstream = subprocess.Popen(
        [sys.executable, "-c", SLOW_UPSTREAM, str(up_port), str(PARTS), str(chunk_delay)], cwd=ROOT, env=env
    )
    proxy = serve_proxy(proxy_port, f"http://127.0.0.1:{up_port}/v1", env)
    base = f"http://127.0.0.1:{proxy_port}/v1"
    try:
        await wait_ready(f"http://127.0.0.1:{up_port}/healthz")
        await wait_ready(f"http://127.0.0.1:{proxy_port}/healthz")
        rss_start = rss_mb(proxy.pid)
        complete, seconds = await slow_streams(base, args.streams)
        print(
            f"{args.streams} concurrent slow streams ({args.stream_seconds:g} s each upstream): "
            f"{complete}/{args.streams} arrived whole in {seconds:.1f} s; "
            f"proxy RSS {rss_start:.0f} MB -> {rss_mb(proxy.pid):.0f} MB"
        )
        result = await many_models(
            base, f"http://127.0.0.1:{proxy_port}/metrics", args.requests, args.concurrency, proxy.pid
        )
        samples = result["samples"]
        lines = [
            f"{args.streams} concurrent slow streams ({args.stream_seconds:g} s each upstream): "
            f"{complete}/{args.streams} arrived whole in {seconds:.1f} s",
            f"{args.requests} requests, each naming a new model and cut to fit: "
            f"{result['ok']}/{args.requests} answered correctly in {result['seconds']:.1f} s "
            f"({args.requests / result['seconds']:.0f} req/s)",
            "  requests done:  " + " ".join(f"{done:>8}" for done, _, _ in samples),
            "  /metrics bytes: " + " ".join(f"{size:>8}" for _, size, _ in samples),
            "  proxy RSS MB:   " + " ".join(f"{rss:>8.0f}" for _, _, rss in samples),
            f"  /metrics size: {trend([float(size) for _, size, _ in samples])}",
            f"  proxy RSS:     {trend([rss for _, _, rss in samples])}",
        ]
        print("\n".join(lines[1:]))
        if args.markdown:
            Path(args.markdown).write_text(markdown(lines, os.getloadavg()[0]), encoding="utf-8")
    finally:
        for process in (proxy, upstream):
            stop(process)


if __name__ == "__main__":
    asyncio.run(main())
