"""Load check for the hardening work: slow streams, many model names, what holds the event loop.

Phases through a real `context-guard serve` process to a fake upstream process, both on
127.0.0.1 (`--only` picks some; each writes its own section of `--markdown`):

1. `--streams` (600) concurrent streamed chat requests, each of which the upstream trickles out
   over `--stream-seconds` (5 s); every stream must arrive whole (all its parts, then `[DONE]`).
   This needs the upstream pool (`server.upstream_connections`, 1024 by default) to hold them all.
2. `--requests` (10,000) chat requests, each naming a model never seen before, sized to be cut
   to the fallback window so that every per-model metric is touched; every answer must be 200
   and name the model asked for. `/metrics` size and the proxy's resident memory are sampled at
   every fifth of the run and reported as flat or growing (bounding the model label is separate work).
3. `cold` and 4. `flood` (`--repeats` times): bench/loop_stalls.py says what they measure. Their
   prober and attackers run in processes of their own; phases 1-2 are clients in this process.

Run: python bench/load_hardening.py [--only streams,models,cold,flood] [--repeats N] [--streams N]
     [--stream-seconds S] [--requests N] [--concurrency C] [--markdown bench/hardening.md]
     [--security-doc docs/security.md]
The last two write their sections in place (between their markers), leaving the rest of the page.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).parent.parent
sys.path.insert(0, str(ROOT))

from bench import loop_stalls  # noqa: E402
from bench.processes import free_port, stop  # noqa: E402
from bench.proxy_overhead import rss_mb, serve_proxy, wait_ready  # noqa: E402
from bench.publish import write_section  # noqa: E402

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


PHASES = ("streams", "models", "cold", "flood")
INTRO = (
    "## Hardening load check (`bench/load_hardening.py`)\n\n"
    "A real `context-guard serve --workers 1` in front of a fake upstream, both on 127.0.0.1, this\n"
    "machine's two cores shared with other work. Written by\n"
    "`python bench/load_hardening.py --markdown bench/hardening.md` (`--only PHASE` rewrites that\n"
    "phase's section alone).\n"
)
NOTES = {
    "models": "The `model` label of every metric is a configured or known model name, or `other`, so `/metrics`\n"
    "stays the same size however many names clients invent.\n",
    "cold": "The guard loads at start (before `/readyz` answers 200) the vocabularies its config can reach\n"
    '(docs/security.md, "What runs off the event loop"); any other loads in a thread on first use.\n',
    "flood": "The prober, the uploads and the hung-up clients are three processes, none sharing the guard's loop.\n",
}


def section(phase: str, lines: list[str]) -> str:
    """`phase`'s part of bench/hardening.md, between its markers."""
    body = "\n".join(lines)
    return (
        f"<!-- {phase}:start -->\n"
        f"Load average {os.getloadavg()[0]:.1f} at the end of this phase "
        f"({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}).\n\n"
        f"```\n{body}\n```\n\n{NOTES.get(phase, '')}<!-- {phase}:end -->"
    )


def write_markdown(path: Path, sections: dict[str, list[str]]) -> None:
    if not path.is_file() or "<!-- streams:start -->" not in path.read_text(encoding="utf-8"):
        path.write_text(INTRO, encoding="utf-8")  # the page as it was before it had sections: begun again
    for phase in PHASES:
        if phase in sections:
            write_section(path, section(phase, sections[phase]), f"<!-- {phase}:start -->", f"<!-- {phase}:end -->")


async def streams_and_models(args: argparse.Namespace, phases: set[str]) -> dict[str, list[str]]:
    up_port, proxy_port = free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    chunk_delay = args.stream_seconds / PARTS
    upstream = subprocess.Popen(
        [sys.executable, "-c", SLOW_UPSTREAM, str(up_port), str(PARTS), str(chunk_delay)], cwd=ROOT, env=env
    )
    proxy = serve_proxy(proxy_port, f"http://127.0.0.1:{up_port}/v1", env)
    base = f"http://127.0.0.1:{proxy_port}/v1"
    sections: dict[str, list[str]] = {}
    try:
        await wait_ready(f"http://127.0.0.1:{up_port}/healthz")
        await wait_ready(f"http://127.0.0.1:{proxy_port}/healthz")
        if "streams" in phases:
            complete, seconds = await slow_streams(base, args.streams)
            sections["streams"] = [
                f"{args.streams} concurrent slow streams ({args.stream_seconds:g} s each upstream): "
                f"{complete}/{args.streams} arrived whole in {seconds:.1f} s"
            ]
            print(sections["streams"][0], flush=True)
        if "models" in phases:
            result = await many_models(
                base, f"http://127.0.0.1:{proxy_port}/metrics", args.requests, args.concurrency, proxy.pid
            )
            samples = result["samples"]
            sections["models"] = [
                f"{args.requests} requests, each naming a new model and cut to fit: "
                f"{result['ok']}/{args.requests} answered correctly in {result['seconds']:.1f} s "
                f"({args.requests / result['seconds']:.0f} req/s)",
                "  requests done:  " + " ".join(f"{done:>8}" for done, _, _ in samples),
                "  /metrics bytes: " + " ".join(f"{size:>8}" for _, size, _ in samples),
                "  proxy RSS MB:   " + " ".join(f"{rss:>8.0f}" for _, _, rss in samples),
                f"  /metrics size: {trend([float(size) for _, size, _ in samples])}",
                f"  proxy RSS:     {trend([rss for _, _, rss in samples])}",
            ]
            print("\n".join(sections["models"]), flush=True)
    finally:
        for process in (proxy, upstream):
            stop(process)
    return sections


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default=",".join(PHASES), help=f"comma-separated phases of {', '.join(PHASES)}")
    parser.add_argument("--streams", type=int, default=600)
    parser.add_argument("--stream-seconds", type=float, default=5.0)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3, help="runs of the flood, each on a fresh guard")
    parser.add_argument("--markdown", help="also write the docs sections to this file (bench/hardening.md)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--security-doc", help="also write the cold and flood tables into this page (docs/security.md)")
    args = parser.parse_args()
    phases = set(args.only.split(","))
    if not phases <= set(PHASES):
        parser.error(f"unknown phase in {args.only!r}")

    print(f"load average at the start: {os.getloadavg()[0]:.1f}", flush=True)
    sections = await streams_and_models(args, phases) if phases & {"streams", "models"} else {}
    tables: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as workdir:
        if "cold" in phases:
            sections["cold"], tables["cold"] = await loop_stalls.cold(Path(workdir))
            print("\n".join(sections["cold"]), flush=True)
        if "flood" in phases:
            sections["flood"], tables["flood"] = await loop_stalls.flood(Path(workdir), args.repeats)
            print("\n".join(sections["flood"][-5:]), flush=True)
    if args.markdown:
        write_markdown(Path(args.markdown), sections)
    if args.security_doc:
        for phase, table in tables.items():
            start, end = f"<!-- {phase}:start (generated by bench/load_hardening.py) -->", f"<!-- {phase}:end -->"
            write_section(Path(args.security_doc), "\n".join([start, *table, end]), start, end)


if __name__ == "__main__":
    asyncio.run(main())
