"""The adversarial suite's harness: attacks on a real guard, over real sockets.

What it gives a test:

- `serve_guard(settings=None, upstream=None, guard=None)`: a real guard app (`create_app`, as
  `context-guard serve` builds it, handlers cancelled when their client leaves) on a 127.0.0.1
  port, in front of a real in-process upstream (`tests.support.upstream.FakeUpstream` unless
  the test passes an aiohttp app of its own, e.g. a misbehaving backend). Guard and upstream run
  in a thread with their own event loop, as a serving process has one: the attack's client and
  the prober each run in loops of their own, so what the prober measures is the guard's loop
  (all three share this process's GIL: a client that copies a 64 MB answer slows the guard too,
  so an attack's client reads what it must check and lets the rest go).
- `prober`: while an attack runs, watches the guard's loop from inside it (`LoopWatch`: a tick
  every `PROBE_EVERY` seconds recording how late it ran and the CPU the loop's thread spent since
  the tick before) and asks `/livez` from a thread and loop of its own.
  `await prober.baseline(guard)` measures the loop with nothing in flight; `async with
  prober.during(guard)` measures it while the block runs (the attack);
  `prober.assert_responsive(baseline, during)` asserts the bounds below.
- `settings(**sections)`: settings as a YAML file would give them, one upstream `fake`.
- `body_of(text)`, `post(...)`, `rss_mb()`, `cpu_seconds()`: small measuring helpers.

The bounds: while an attack is in flight, `/livez` answers every time it is asked; the guard's
loop runs no work longer than `LOOP_CPU_MS` (100 ms) at a stretch; and its ticks run late by no
more than `LATE_CAP_MS` (2 s) at p99. The first two cannot flake: the loop's CPU is its thread's
own (`time.thread_time`), which neither the machine's load nor the other threads sharing this
process's GIL (the attack's client, the prober) move. Lateness does move with them, so its bound
is generous: it catches a thread that holds the GIL for seconds, not a busy machine. An attack
that did its work on the loop shows as loop CPU far over the bound (count_tokens counting 6 MB
on the loop held it for seconds).

Adding an attack (the core's: a PDF page count with no `/Count`, `$ref` chains, CPU-heavy text,
memory per MB): one test per attack in a new `tests/adversarial/test_<attack>.py`, shaped as

    async def test_a_pdf_without_count_does_not_stall_the_loop(serve_guard, prober, settings):
        guard = await serve_guard(settings())
        base = await prober.baseline(guard)
        async with prober.during(guard) as during:
            status, body, _ = await post(guard.url("/v1/chat/completions"), body_of_pdf(...))
        prober.assert_responsive(base, during)
        assert status == 200 and ...          # the answer's shape

and, for its figures, one entry in `bench/adversarial.py`'s `ATTACKS` (see its docstring).
Bodies are built in memory, requests go only to 127.0.0.1, and every wait has a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import statistics
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import aiohttp
import pytest
from aiohttp import web

from proxy.config.settings import Settings, settings_from_dict
from proxy.server.backends.models import Models
from proxy.server.process.app import create_app
from tests.support.upstream import FakeUpstream

T = TypeVar("T")

LOOP_CPU_MS = 100.0
LATE_CAP_MS = 2000.0
PROBE_EVERY = 0.01
CLIENT_TIMEOUT = aiohttp.ClientTimeout(total=60)


def make_settings(upstream_url: str = "http://127.0.0.1:9/v1", **sections: Any) -> Settings:
    """Settings as a YAML file would give them: one upstream `fake` unless `upstreams` is given."""
    fake = {"base_url": upstream_url, "kind": "generic", "read_timeout": 10, "connect_timeout": 2}
    data: dict[str, Any] = {"upstreams": {"fake": fake}}
    data.update(sections)
    return settings_from_dict(data, "adversarial.yaml", {})


class GuardServer:
    """A guard (and its upstream) served from a thread with its own event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="guard-loop", daemon=True)
        self._runners: list[web.AppRunner] = []
        self.app: web.Application | None = None
        self.upstream: FakeUpstream | None = None
        self.upstream_url = ""
        self.base = ""

    def start(self) -> None:
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = 30) -> T:
        """Run `coro` on the guard's loop and wait for it (from the test's thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def on_guard_loop(self, work: Callable[[], T]) -> T:
        """`work()` run on the guard's loop, awaited from the test's loop."""

        async def run() -> T:
            return work()

        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run(), self.loop))

    async def _serve(self, app: web.Application) -> str:
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self._runners.append(runner)
        server = site._server
        assert server is not None and server.sockets  # type: ignore[union-attr]
        port = server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}"

    def serve_upstream(self, app: web.Application | None) -> str:
        if app is None:

            async def made() -> web.Application:
                self.upstream = FakeUpstream()
                return self.upstream.app()

            app = self.call(made())
        self.upstream_url = self.call(self._serve(app)) + "/v1"
        return self.upstream_url

    def serve_guard(self, settings: Settings, guard: Models | None, model_map: Any) -> None:
        async def made() -> web.Application:
            return create_app(settings, guard or Models(settings, model_map))

        self.app = self.call(made())
        self.base = self.call(self._serve(self.app))

    def url(self, path: str) -> str:
        return self.base + path

    def stop(self) -> None:
        for runner in reversed(self._runners):
            with contextlib.suppress(Exception):
                self.call(runner.cleanup(), timeout=15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=15)
        if not self._thread.is_alive():
            self.loop.close()


ServeGuard = Callable[..., Awaitable[GuardServer]]


@pytest.fixture
async def serve_guard(model_map: Any) -> AsyncIterator[ServeGuard]:
    started: list[GuardServer] = []

    async def serve(
        settings: Settings | Callable[[str], Settings] | None = None,
        upstream: web.Application | None = None,
        guard: Models | Callable[[Settings], Models] | None = None,
    ) -> GuardServer:
        """`settings` may be a function of the upstream's URL (`lambda url: make_settings(url, ...)`)."""
        server = GuardServer()
        started.append(server)
        server.start()
        url = await asyncio.to_thread(server.serve_upstream, upstream)
        chosen = settings(url) if callable(settings) else settings or make_settings(url)
        made = guard(chosen) if callable(guard) else guard
        await asyncio.to_thread(server.serve_guard, chosen, made, model_map)
        return server

    yield serve
    for server in started:
        await asyncio.to_thread(server.stop)


@dataclass
class Stalls:
    """What the guard's loop did between ticks `PROBE_EVERY` apart, measured on that loop itself:
    how late each tick ran by the loop's clock (`late_ms`) and how much CPU the loop's thread spent
    since the tick before (`busy_ms`); and how `/livez` answered meanwhile."""

    late_ms: list[float] = field(default_factory=list)
    busy_ms: list[float] = field(default_factory=list)
    answered: int = 0
    failures: int = 0

    @property
    def p99(self) -> float:
        """The 99th percentile of the ticks' lateness, in ms."""
        if not self.late_ms:
            return float("inf")
        ordered = sorted(self.late_ms)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]

    @property
    def busiest(self) -> float:
        """The most CPU the loop's thread spent between two ticks, in ms."""
        return max(self.busy_ms, default=0.0)

    def __str__(self) -> str:
        return (
            f"{len(self.late_ms)} ticks, lateness median {statistics.median(self.late_ms or [0]):.1f} ms, "
            f"p99 {self.p99:.1f} ms, max {max(self.late_ms, default=0):.1f} ms; the loop's CPU between ticks "
            f"at most {self.busiest:.1f} ms; /livez answered {self.answered}"
        )


class LoopWatch:
    """Ticks on the guard's loop every `PROBE_EVERY` seconds and records each tick's lateness (the
    loop's clock) and its thread's CPU time since the tick before (`time.thread_time`, which other
    threads and processes do not inflate): a stall is seen where it happens, in the process under
    test, not through a client's round trip. Runs on the guard's loop; read from the test's."""

    def __init__(self, loop: asyncio.AbstractEventLoop, into: Stalls, ticks_wanted: int = 0) -> None:
        self._loop, self._into = loop, into
        self._due = 0.0
        self._cpu = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self.ticks_wanted = ticks_wanted
        self.enough = threading.Event()

    def start(self) -> None:
        self._loop.call_soon_threadsafe(self._first)

    def _first(self) -> None:
        self._due, self._cpu = self._loop.time() + PROBE_EVERY, time.thread_time()
        self._handle = self._loop.call_at(self._due, self._tick)

    def _tick(self) -> None:
        now, cpu = self._loop.time(), time.thread_time()
        self._into.late_ms.append((now - self._due) * 1000)
        self._into.busy_ms.append((cpu - self._cpu) * 1000)
        if len(self._into.late_ms) >= self.ticks_wanted:
            self.enough.set()
        self._due, self._cpu = now + PROBE_EVERY, cpu
        self._handle = self._loop.call_at(self._due, self._tick)

    def stop(self) -> None:
        def cancel() -> None:
            if self._handle is not None:
                self._handle.cancel()

        self._loop.call_soon_threadsafe(cancel)


class Prober:
    """While an attack runs: a `LoopWatch` on the guard's loop, and `/livez` asked over one kept-alive
    connection from a thread and event loop of its own (so neither the guard's work nor the attack's
    client delays the asking). The bound is asserted on what the watch measured inside the guard's
    process; `/livez` must answer every time it is asked, and once more after the attack."""

    @staticmethod
    async def _probe(url: str, into: Stalls, stop: threading.Event, answered: threading.Event) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            while not stop.is_set():
                try:
                    async with session.get(url) as response:
                        await response.read()
                        ok = response.status == 200
                except (aiohttp.ClientError, TimeoutError):
                    ok = False
                if ok:
                    into.answered += 1
                    answered.set()
                else:
                    into.failures += 1
                # A pace for the asking, not an ordering: the watch measures the loop on its own.
                await asyncio.sleep(PROBE_EVERY)

    @contextlib.asynccontextmanager
    async def during(self, guard: GuardServer, ticks_wanted: int = 1) -> AsyncIterator[Stalls]:
        """The guard's loop measured while the block runs; on leaving, it waits for `ticks_wanted`
        ticks and one `/livez` answer given after the block (each wait bounded by a timeout)."""
        stalls, stop, answered = Stalls(), threading.Event(), threading.Event()
        watch = LoopWatch(guard.loop, stalls, ticks_wanted)
        watch.start()
        thread = threading.Thread(
            target=lambda: asyncio.run(self._probe(guard.url("/livez"), stalls, stop, answered)),
            name="prober",
            daemon=True,
        )
        thread.start()
        try:
            yield stalls
            answered.clear()
            assert await asyncio.to_thread(answered.wait, 30), "/livez gave no answer after the attack"
            assert await asyncio.to_thread(watch.enough.wait, 30), f"the guard's loop ticked too few times: {stalls}"
        finally:
            watch.stop()
            stop.set()
            await asyncio.to_thread(thread.join, 35)

    async def baseline(self, guard: GuardServer, ticks: int = 50) -> Stalls:
        """The guard's loop with nothing in flight, over `ticks` ticks."""
        async with self.during(guard, ticks_wanted=ticks) as stalls:
            pass
        return stalls

    def assert_responsive(self, baseline: Stalls, during: Stalls, at_most_ms: float | None = None) -> None:
        """The guard's loop ran no work longer than `LOOP_CPU_MS` at a stretch (or the attack's own
        `at_most_ms`, when lower), its ticks were never late past `LATE_CAP_MS` at p99, and `/livez`
        answered every time it was asked. The loop's CPU is the thread's own: the machine's load
        and the threads that share the GIL do not move it, so that bound holds on a busy machine;
        the lateness bound is generous, for stalls a thread holding the GIL causes."""
        cpu_bound = min(LOOP_CPU_MS, at_most_ms or LOOP_CPU_MS)
        assert during.failures == 0, f"/livez failed {during.failures} times during the attack"
        assert during.busiest <= cpu_bound, f"the guard's loop worked {during.busiest:.0f} ms at a stretch: {during}"
        assert during.p99 <= LATE_CAP_MS, f"the guard's loop ran late: {during} (baseline {baseline})"


@pytest.fixture
def prober() -> Prober:
    return Prober()


@pytest.fixture
def settings() -> Callable[..., Callable[[str], Settings]]:
    """`settings(**sections)`: a function of the upstream URL, for `serve_guard`."""

    def build(**sections: Any) -> Callable[[str], Settings]:
        return lambda url: make_settings(url, **sections)

    return build


def body_of(text: str, model: str = "gpt-4o", **fields: Any) -> bytes:
    """A chat body with one user message of `text`, encoded once (the attack's client sends bytes)."""
    return json.dumps({"model": model, "messages": [{"role": "user", "content": text}], **fields}).encode()


def anthropic_body_of(text: str, model: str = "claude-3-5-sonnet-20241022") -> bytes:
    return json.dumps({"model": model, "max_tokens": 16, "messages": [{"role": "user", "content": text}]}).encode()


def prose(size: int) -> str:
    """About `size` bytes of ordinary English."""
    sentence = "The quick brown fox jumps over the lazy dog while the river runs to the sea. "
    return (sentence * (size // len(sentence) + 1))[:size]


async def post(
    url: str, body: bytes, headers: dict[str, str] | None = None, timeout: float = 60
) -> tuple[int, bytes, float]:
    """POST `body`; (status, answer, seconds)."""
    started = time.perf_counter()
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
        session.post(url, data=body, headers={"Content-Type": "application/json", **(headers or {})}) as r,
    ):
        answer = await r.read()
        return r.status, answer, time.perf_counter() - started


async def get(url: str, headers: dict[str, str] | None = None, timeout: float = 60) -> tuple[int, bytes, float]:
    """GET `url`; (status, answer, seconds)."""
    started = time.perf_counter()
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
        session.get(url, headers=headers) as r,
    ):
        return r.status, await r.read(), time.perf_counter() - started


async def hang_up_after(url: str, body: bytes, seconds: float, headers: dict[str, str] | None = None) -> None:
    """Send `body`, then close the connection after `seconds` without reading an answer (as an attacker does)."""
    with contextlib.suppress(TimeoutError, aiohttp.ClientError):
        async with aiohttp.ClientSession() as session:
            await asyncio.wait_for(
                session.post(url, data=body, headers={"Content-Type": "application/json", **(headers or {})}), seconds
            )


def rss_mb() -> float:
    """This process's peak resident memory, in MB (the guard runs in it)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def assert_refused_over_window(answers: list[tuple[int, bytes, float]]) -> None:
    """Every answer is OpenAI's 400 `context_length_exceeded` (what `post` returned for each)."""
    for status, answer, _ in answers:
        assert status == 400, answer[:300]
        error = json.loads(answer)["error"]
        assert error["code"] == "context_length_exceeded" and error["type"] == "invalid_request_error"
