"""The client side of the end-to-end benchmark: bodies, and the ways of sending them.

Every measure takes several targets (the fake upstream itself, the bare proxy, context-guard)
and sends to them interleaved, request by request (here) or slice by slice (bench/rounds.py),
so that a noisy neighbour on the machine slows all of them alike instead of whichever happened
to run at that moment.

Bodies are made from one template per size with a placeholder in every message; each request
replaces it with a nonce used nowhere else in the run, so a cold body shares nothing that a
cache could have kept. A warm body is one fixed conversation plus one new turn.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from yarl import URL as yarl_url

from bench.conversations import agent_conversation
from bench.processes import process_tree_cpu_seconds  # noqa: F401  # where it used to be

NONCE = b"@@N@@"
BYTES_PER_TOKEN = 3.7  # of agent_conversation() rendered as JSON
MODEL = "gpt-4.1"  # o200k_base, a 1M-token window: every body here fits and is forwarded as received
_RUN = uuid.uuid4().hex[:8]
_SEQUENCE = itertools.count()
# What every client sends, as the SDKs do: a credential. The guard keeps its count cache per client
# (the credential, else the connection), so a benchmark without one would measure a new
# connection's request as a stranger's: never warm.
CLIENT_HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}


def nonce() -> bytes:
    """A value no other request of this run (or any earlier run) has carried."""
    return f"{_RUN}-{next(_SEQUENCE)}".encode()


@dataclass(frozen=True)
class Bodies:
    """Request bodies of about `size` bytes: `cold()` new in every message, `warm()` one new turn."""

    size: int
    cold_template: bytes
    warm_template: bytes
    base: bytes  # the warm conversation without its new turn: sent once to fill caches
    conversation: dict[str, Any] = field(compare=False, repr=False)  # `base` as objects (`warm_request`)

    @classmethod
    def of_size(cls, size: int, stream: bool = False, longer: int = 1) -> Bodies:
        """About `size` bytes of agent conversation; with `longer`, each turn's tool result and
        answer that many times longer, so the same bytes hold about that many times fewer messages."""
        body = agent_conversation(max(1, int(size / BYTES_PER_TOKEN)), 1000 * longer, longer)
        body["model"] = MODEL
        if stream:
            body["stream"] = True
        messages = body["messages"]
        cold = {**body, "messages": [_marked(m) for m in messages]}
        warm = {**body, "messages": [*messages, *_new_turn(NONCE.decode())]}
        return cls(size, orjson.dumps(cold), orjson.dumps(warm), orjson.dumps(body), body)

    def cold(self) -> bytes:
        return self.cold_template.replace(NONCE, nonce())

    def warm(self) -> bytes:
        return self.warm_template.replace(NONCE, nonce())

    def warm_request(self) -> dict[str, Any]:
        """`warm()` as an application holds it when it calls its SDK: the conversation's objects
        and a new turn appended (the SDK serialises them; nothing here is JSON yet)."""
        base = self.conversation
        return {**base, "messages": [*base["messages"], *_new_turn(nonce().decode())]}


def _new_turn(marker: str) -> list[dict[str, Any]]:
    """The answer and the follow-up question a warm body adds to the conversation."""
    return [
        {"role": "assistant", "content": f"{marker} Nothing material; the totals hold."},
        {"role": "user", "content": f"{marker} Follow-up: what changed since the last answer?"},
    ]


def _marked(message: dict[str, Any]) -> dict[str, Any]:
    """The message with the placeholder in its content and its tool call ids, so that no message
    of a cold body (not even a tool call with no text) is the same as in any other body."""
    marked = dict(message)
    if isinstance(marked.get("content"), str):
        marked["content"] = f"{NONCE.decode()} {marked['content']}"
    if "tool_call_id" in marked:
        marked["tool_call_id"] = f"{marked['tool_call_id']}_{NONCE.decode()}"
    if "tool_calls" in marked:
        marked["tool_calls"] = [{**c, "id": f"{c['id']}_{NONCE.decode()}"} for c in marked["tool_calls"]]
    return marked


SMALL = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Hello there, how are you today?"}]})


@dataclass
class Target:
    name: str
    url: str  # ends in /v1
    session: aiohttp.ClientSession | None = None
    pid: int | None = None

    async def open(self, connections: int = 600) -> None:
        connector = aiohttp.TCPConnector(limit=connections, limit_per_host=0)
        timeout = aiohttp.ClientTimeout(total=300)
        self.session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def post(self, payload: bytes, query: str = "") -> float:
        """Send one chat request and read the whole answer; the seconds it took."""
        assert self.session is not None
        url = f"{self.url}/chat/completions" + (f"?{query}" if query else "")
        started = time.perf_counter()
        async with self.session.post(url, data=payload, headers=CLIENT_HEADERS) as r:
            await r.read()
            if r.status != 200:
                raise RuntimeError(f"{self.name} answered {r.status}")
        return time.perf_counter() - started


def rotated(targets: Sequence[Target], i: int) -> list[Target]:
    k = i % len(targets)
    return [*targets[k:], *targets[:k]]


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summary_ms(values: Sequence[float]) -> dict[str, float]:
    return {"p50": statistics.median(values) * 1000, "p99": percentile(values, 0.99) * 1000, "n": len(values)}


async def latency(targets: Sequence[Target], make_body: Callable[[], bytes], requests: int) -> dict[str, list[float]]:
    """One request in flight: each body goes to every target, in a rotating order."""
    times: dict[str, list[float]] = {t.name: [] for t in targets}
    for i in range(requests):
        payload = make_body()
        for target in rotated(targets, i):
            times[target.name].append(await target.post(payload))
    return times


class Connection:
    """A client of the throughput scenario: one keep-alive HTTP/1.1 connection that posts chat
    requests and reads each answer whole (Content-Length or chunked). It sends what `Target.post`
    sends (the same body, `Content-Type` and `Content-Length`), at a fraction of aiohttp's client
    cost per request: on a machine whose cores the client shares with the servers it measures,
    the client's own CPU is taken from them (bench/changes.md, "Isolation and workers")."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> None:
        self.reader, self.writer, self.head = reader, writer, head

    @classmethod
    async def open(cls, base_url: str) -> Connection:
        url = yarl_url(base_url)
        reader, writer = await asyncio.open_connection(url.host, url.port, limit=1 << 20)
        head = (
            f"POST {url.path.rstrip('/')}/chat/completions HTTP/1.1\r\nHost: {url.host}:{url.port}\r\n"
            "Content-Type: application/json\r\nAuthorization: Bearer sk-bench\r\nContent-Length: "
        ).encode()
        return cls(reader, writer, head)

    async def post(self, payload: bytes) -> None:
        """Send one request and read its whole answer; an answer other than 200 is an error."""
        self.writer.write(b"%s%d\r\n\r\n" % (self.head, len(payload)))
        self.writer.write(payload)
        head = await self.reader.readuntil(b"\r\n\r\n")
        if head[9:12] != b"200":
            raise RuntimeError(f"answered {head[9:12].decode(errors='replace')}")
        headers = head.lower()
        if b"transfer-encoding: chunked" in headers:
            while size := int((await self.reader.readuntil(b"\r\n"))[:-2].split(b";")[0], 16):
                await self.reader.readexactly(size + 2)
            await self.reader.readuntil(b"\r\n")  # the blank line after the last chunk (no trailers)
        else:
            length = headers.split(b"content-length:", 1)[1].split(b"\r\n", 1)[0]
            await self.reader.readexactly(int(length))

    async def close(self) -> None:
        self.writer.close()


class HttpxClient:
    """A client of the SDK-like throughput measure: an SDK's transport without the openai SDK's
    own work on its arguments (which costs tens of milliseconds per 88 KB conversation): httpx
    over one keep-alive connection, each request's objects serialised to JSON by httpx, each
    answer parsed (`response.json()`), as the lighter SDKs and gateways' clients do."""

    def __init__(self, client: Any, url: str) -> None:
        self.client, self.url = client, url

    @classmethod
    async def open(cls, base_url: str) -> HttpxClient:
        import httpx

        limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
        client = httpx.AsyncClient(limits=limits, timeout=300, headers=CLIENT_HEADERS)
        return cls(client, f"{base_url.rstrip('/')}/chat/completions")

    async def post(self, request: dict[str, Any]) -> None:
        """One chat request; an answer other than 200 is an error."""
        answer = await self.client.post(self.url, json=request)
        if answer.status_code != 200:
            raise RuntimeError(f"answered {answer.status_code}")
        answer.json()

    async def close(self) -> None:
        await self.client.aclose()


class SdkClient:
    """A client of the SDK-like throughput measure: the official openai SDK (`AsyncOpenAI`, over
    an httpx pool of one keep-alive connection), used as an application uses it: each request
    handed over as Python objects that the SDK serialises, each answer parsed into its types.
    Its CPU per request is many times `Connection`'s, taken from the same cores the servers use,
    as an application's would be."""

    def __init__(self, client: Any) -> None:
        self.client = client

    @classmethod
    async def open(cls, base_url: str) -> SdkClient:
        import httpx
        import openai

        pool = httpx.AsyncClient(limits=httpx.Limits(max_connections=1, max_keepalive_connections=1), timeout=300)
        return cls(openai.AsyncOpenAI(base_url=base_url, api_key="sk-bench", max_retries=0, http_client=pool))

    async def post(self, request: dict[str, Any]) -> None:
        """One chat request (`Bodies.warm_request()` or its like); an error answer raises."""
        await self.client.chat.completions.create(**request)

    async def close(self) -> None:
        await self.client.close()


@dataclass
class StreamTiming:
    first_byte: float
    gaps: list[float] = field(default_factory=list)
    chunks: int = 0


async def stream_once(target: Target, payload: bytes, query: str) -> StreamTiming:
    """Time to the first byte of the answer, then the gap between each SSE event and the next."""
    assert target.session is not None
    started = time.perf_counter()
    async with target.session.post(f"{target.url}/chat/completions?{query}", data=payload, headers=CLIENT_HEADERS) as r:
        if r.status != 200:
            raise RuntimeError(f"{target.name} answered {r.status}")
        timing: StreamTiming | None = None
        last = started
        async for _ in r.content:  # one line at a time; each event is a data line then a blank line
            now = time.perf_counter()
            if timing is None:
                timing = StreamTiming(now - started)
            elif now - last > 0.001:  # the blank line after an event arrives with it
                timing.gaps.append(now - last)
            timing.chunks += 1
            last = now
    assert timing is not None
    return timing


async def streams(target: Target, payload: bytes, query: str, concurrent: int) -> dict[str, float]:
    """`concurrent` streams at once through one target: all must finish; the longest gap says
    whether any stalled."""
    started = time.perf_counter()
    results = await asyncio.gather(*(stream_once(target, payload, query) for _ in range(concurrent)))
    gaps = [g for t in results for g in t.gaps]
    return {
        "seconds": time.perf_counter() - started,
        "completed": float(len(results)),
        "first_byte_p99_ms": percentile([t.first_byte for t in results], 0.99) * 1000,
        "gap_p99_ms": percentile(gaps, 0.99) * 1000,
        "gap_max_ms": max(gaps) * 1000,
    }


async def small_latency(target: Target, requests: int) -> list[float]:
    """`requests` small requests, one at a time, the seconds each took."""
    return [await target.post(SMALL) for _ in range(requests)]


async def small_latency_while(target: Target, size: int, bodies: int, max_seconds: float = 120.0) -> list[float]:
    """Small requests one at a time while another client keeps one cold body of about `size`
    bytes in flight, until `bodies` more of them have been answered (or `max_seconds` passed): every
    phase of a large body's life (upload, parse, count, plan, forwarding) is under the small ones.

    The large bodies are made and sent by another process (`python bench/load.py send-large`):
    in this one, making and writing 10 MB would hold the loop that times the small requests, and
    the figure would be the client's delay as much as the proxy's."""
    sender = await asyncio.create_subprocess_exec(
        sys.executable,
        str(Path(__file__)),
        "send-large",
        target.url,
        str(size),
        stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)},
    )
    assert sender.stdout is not None
    answered = 0

    async def count_answers() -> None:
        nonlocal answered
        async for _ in sender.stdout:  # type: ignore[union-attr]  # piped above
            answered += 1

    times: list[float] = []
    try:
        if await sender.stdout.readline() != b"sending\n":
            raise RuntimeError("bench/load.py send-large did not start")
        counter = asyncio.create_task(count_answers())
        await asyncio.sleep(0.2)  # let the first large body arrive
        deadline, goal = time.perf_counter() + max_seconds, answered + bodies
        while not times or (answered < goal and time.perf_counter() < deadline and not counter.done()):
            times.append(await target.post(SMALL))
    finally:
        if sender.returncode is None:
            sender.terminate()
        await sender.wait()
    if answered < goal and time.perf_counter() < deadline:
        raise RuntimeError(f"the large-body client stopped (exit status {sender.returncode})")
    return times


async def _send_large(url: str, size: int) -> None:
    """Keep one cold body of about `size` bytes in flight to `url`; a line for each answer."""
    target = Target("large", url)
    await target.open()
    bodies = Bodies.of_size(size)
    print("sending", flush=True)
    try:
        while True:
            await target.post(bodies.cold())
            print("answered", flush=True)
    finally:
        await target.close()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def process_tree_rss_mb(pid: int) -> float:
    """RSS of a process and its children (a supervisor and its workers)."""
    total = rss_mb(pid)
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        for child in children.read_text().split():
            total += process_tree_rss_mb(int(child))
    return total


async def peak_rss_during(pid: int, work: Callable[[], Any]) -> tuple[float, Any]:
    """The highest RSS of `pid` sampled every 20 ms while `work()` runs, and its result."""
    peak = rss_mb(pid)
    task = asyncio.ensure_future(work())
    while not task.done():
        peak = max(peak, rss_mb(pid))
        await asyncio.sleep(0.02)
    return peak, task.result()


def cpu_count() -> int:
    return len(os.sched_getaffinity(0))


if __name__ == "__main__":  # the large-body client of `small_latency_while`
    if sys.argv[1:2] != ["send-large"] or len(sys.argv) != 4:
        raise SystemExit("usage: python bench/load.py send-large URL SIZE")
    asyncio.run(_send_large(sys.argv[2], int(sys.argv[3])))
