"""What the proxy costs: latency and throughput through context-guard vs straight to the upstream.

The fake upstream and the proxy each run in their own process on 127.0.0.1; this process is the
client. Each scenario is measured twice in the same run, direct and through the proxy, and the
ratio printed. Scenarios: a small chat request; a 100k-token conversation that fits gpt-4o (counted,
forwarded byte for byte); a 300k-token conversation cut to gpt-4o's window; a streamed request.
The proxy's resident memory is read from /proc before and after.

Run: python bench/proxy_overhead.py [--requests N] [--concurrency C]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT))

from bench.conversations import agent_conversation  # noqa: E402
from bench.processes import free_port, stop  # noqa: E402

UPSTREAM = (
    "import sys; from aiohttp import web; from tests.support.upstream import FakeUpstream; "
    "web.run_app(FakeUpstream().app(), host='127.0.0.1', port=int(sys.argv[1]), print=None, access_log=None)"
)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def serve_proxy(port: int, upstream_url: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """`context-guard serve` on `port` in front of `upstream_url`, its log discarded."""
    command = [sys.executable, "-m", "proxy", "serve", "--workers", "1", "--port", str(port)]
    command += ["--upstream", upstream_url]
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def wait_ready(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(300):
            try:
                async with session.get(url) as r:
                    if r.status < 500:
                        return
            except aiohttp.ClientConnectionError:
                await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


async def measure(base: str, body: dict[str, Any], requests: int, concurrency: int) -> dict[str, float]:
    payload = json.dumps(body).encode()
    latencies: list[float] = []
    limit = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> None:
            async with limit:
                start = time.perf_counter()
                async with session.post(
                    f"{base}/chat/completions", data=payload, headers={"Content-Type": "application/json"}
                ) as r:
                    await r.read()
                    assert r.status == 200, r.status
                latencies.append(time.perf_counter() - start)

        started = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(requests)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    return {
        "p50_ms": statistics.median(latencies) * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1] * 1000,
        "rps": requests / elapsed,
    }


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()

    up_port, proxy_port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    upstream = subprocess.Popen([sys.executable, "-c", UPSTREAM, str(up_port)], cwd=ROOT, env=env)
    proxy = serve_proxy(proxy_port, f"http://127.0.0.1:{up_port}/v1", env)
    try:
        await wait_ready(f"http://127.0.0.1:{up_port}/healthz")
        await wait_ready(f"http://127.0.0.1:{proxy_port}/healthz")
        rss_start = rss_mb(proxy.pid)
        small = {"model": "gpt-4o", "messages": [{"role": "user", "content": "Hello there, how are you today?"}]}
        fits = agent_conversation(100_000)
        fits["model"] = "gpt-4o"
        over = agent_conversation(300_000)
        over["model"] = "gpt-4o"
        streamed = {**small, "stream": True}
        scenarios = [
            ("small request", small, args.requests),
            ("100k tokens, fits (forwarded as is)", fits, max(20, args.requests // 10)),
            ("300k tokens, trimmed to 128k", over, max(10, args.requests // 20)),
            ("small request, streamed", streamed, args.requests),
        ]
        print(
            f"{'scenario':38} {'direct p50':>10} {'proxy p50':>10} {'added p50':>10} {'proxy p99':>10} "
            f"{'direct rps':>10} {'proxy rps':>10} {'rps ratio':>9}"
        )
        for name, body, n in scenarios:
            await measure(f"http://127.0.0.1:{proxy_port}/v1", body, min(n, 10), args.concurrency)  # warm-up
            direct = await measure(f"http://127.0.0.1:{up_port}/v1", body, n, args.concurrency)
            proxied = await measure(f"http://127.0.0.1:{proxy_port}/v1", body, n, args.concurrency)
            print(
                f"{name:38} {direct['p50_ms']:9.1f}ms {proxied['p50_ms']:9.1f}ms "
                f"{proxied['p50_ms'] - direct['p50_ms']:9.1f}ms {proxied['p99_ms']:9.1f}ms "
                f"{direct['rps']:10.0f} {proxied['rps']:10.0f} {proxied['rps'] / direct['rps']:8.2f}x"
            )
        print(
            f"proxy resident memory: {rss_start:.0f} MB after start, {rss_mb(proxy.pid):.0f} MB after the run "
            f"({args.concurrency} concurrent clients, {os.cpu_count()} cores shared by client, proxy and upstream)"
        )
    finally:
        for process in (proxy, upstream):
            stop(process)


if __name__ == "__main__":
    asyncio.run(main())
