"""Real components on loopback for the `components` tests: redis-server, haproxy, proxy processes.

`scripts/install-components.sh` installs redis-server and haproxy; without them these tests skip.
Every process is stopped (and killed if it does not stop) when its test ends.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis

from tests.support.processes import Guard, PortTaken, Process, free_port, listens, on_free_port
from tests.support.upstream import FakeUpstream

pytestmark = pytest.mark.components


def need(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        pytest.skip(f"{binary} is not installed (scripts/install-components.sh installs it)")
    return path


class RedisServer(Process):
    """redis-server on `port` (redis cannot bind port 0 and say which it got: `started` starts it on
    a free port, and on another if that one was taken before redis could bind it)."""

    def __init__(self, log_dir: Path, port: int | None = None) -> None:
        self.port = free_port() if port is None else port
        args = [
            need("redis-server"),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        super().__init__("redis", args, log_dir / "redis.log")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @classmethod
    def started(cls, log_dir: Path) -> RedisServer:
        def start(port: int) -> RedisServer:
            server = cls(log_dir, port)
            server.start()
            server.until_ready()
            return server

        return on_free_port(start)

    def until_ready(self, timeout: float = 20) -> None:
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5, socket_timeout=0.5)
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self.popen is not None and self.popen.poll() is not None:
                    if "Address already in use" in self.output:  # another process took the port first
                        raise PortTaken(f"redis-server: port {self.port} was taken")
                    raise RuntimeError(f"redis-server exited with {self.popen.returncode}:\n{self.output[-2000:]}")
                if self.popen is not None and not listens(self.pid, self.port):  # not up yet
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"redis-server not listening within {timeout} s:\n{self.output[-2000:]}")
                    time.sleep(0.05)
                    continue
                try:
                    if client.ping():
                        return
                except (redis.ConnectionError, redis.TimeoutError):  # listening, not answering yet
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        finally:
            client.close()

    def clients(self) -> int:
        """Connections open to this server, other than the one asking."""
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        try:
            return len(client.client_list()) - 1
        finally:
            client.close()

    def restart(self) -> None:
        self.stop()
        self.start()
        self.until_ready()

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer.started(tmp_path)
    try:
        yield server
    finally:
        server.resume()  # a paused server ignores SIGTERM until it runs again
        server.stop(5)


HAPROXY_CONFIG = """
global
    log stderr format raw local0 info
defaults
    mode http
    log global
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    retries 3
    option redispatch
    # A request that met a connection closing under it is sent again (to another replica).
    retry-on conn-failure empty-response
frontend guard
    bind 127.0.0.1:{port}
    default_backend guards
backend guards
    balance roundrobin
    option httpchk GET /readyz
    http-response set-header x-served-by %s
    default-server check inter 250ms fall 1 rise 2
{servers}
"""


class HAProxy(Process):
    """HAProxy on `port` in front of `guards` (it cannot bind port 0 and say which it got: `started`
    starts it on a free port, and on another if that one was taken before HAProxy could bind it)."""

    def __init__(self, log_dir: Path, guards: list[Guard], port: int | None = None) -> None:
        self.port = free_port() if port is None else port
        servers = "\n".join(f"    server {g.name} 127.0.0.1:{g.port}" for g in guards)
        config = log_dir / "haproxy.cfg"
        config.write_text(HAPROXY_CONFIG.format(port=self.port, servers=servers))
        super().__init__("haproxy", [need("haproxy"), "-db", "-f", str(config)], log_dir / "haproxy.log")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    @classmethod
    def started(cls, log_dir: Path, guards: list[Guard], processes: list[Process], timeout: float = 30) -> HAProxy:
        def start(port: int) -> HAProxy:
            haproxy = cls(log_dir, guards, port)
            processes.append(haproxy)
            haproxy.start()
            deadline = time.monotonic() + timeout
            while not listens(haproxy.pid, port):
                assert haproxy.popen is not None
                if haproxy.popen.poll() is not None:
                    if "cannot bind socket" in haproxy.output:  # another process took the port first
                        raise PortTaken(f"haproxy: port {port} was taken")
                    raise RuntimeError(f"haproxy exited with {haproxy.popen.returncode}:\n{haproxy.output[-2000:]}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"haproxy not listening within {timeout} s:\n{haproxy.output[-2000:]}")
                time.sleep(0.05)
            return haproxy

        return on_free_port(start)


@pytest.fixture
async def start_upstream() -> AsyncIterator[Any]:
    """Fake upstreams on real ports of their own (the proxies are other processes)."""
    from aiohttp import web

    runners: list[web.AppRunner] = []

    async def start() -> FakeUpstream:
        fake = FakeUpstream()
        runner = web.AppRunner(fake.app(), handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()  # port 0: bound, never raced
        port = runner.addresses[0][1]
        runners.append(runner)
        fake.url = f"http://127.0.0.1:{port}/v1"  # type: ignore[attr-defined]
        return fake

    try:
        yield start
    finally:
        for runner in runners:
            await runner.cleanup()


@pytest.fixture
def processes() -> Iterator[list[Process]]:
    """Processes a test starts; every one is stopped at the end, whatever happened."""
    started: list[Process] = []
    try:
        yield started
    finally:
        for process in started:
            process.stop(10)


async def all_ready(guards: list[Any], timeout: float = 120) -> None:
    await asyncio.gather(*(g.until_ready(timeout) for g in guards))


async def warmed(guards: list[Any]) -> None:
    """One chat request to each guard directly. Its first request for a model whose vocabulary no
    config names (gpt-4o, with only `--upstream`) loads that vocabulary, about half a second in
    which the process answers nothing: behind HAProxy's 250 ms check with `fall 1`, that request
    would take the replica out of the pool while a test starts (docs/deployment.md says so)."""
    async with aiohttp.ClientSession() as session:
        for guard in guards:
            async with session.post(guard.url("/v1/chat/completions"), json=CHAT) as response:
                assert response.status == 200, await response.text()


@pytest.fixture
def logs() -> Any:
    from tests.server.conftest import Logs

    return Logs()


CHAT = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}


@dataclass
class Outcome:
    """One request through the load balancer, as its client saw it."""

    started: float
    status: int | None = None
    served_by: str | None = None  # the replica, from HAProxy's x-served-by header
    error: str | None = None
    body: str = ""
    seconds: float = 0.0
    request_id: str | None = None  # the replica's, from its x-request-id header


async def call(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Outcome:
    outcome = Outcome(time.monotonic())
    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=30)) as r:
            outcome.body = (await r.read()).decode()
            outcome.status, outcome.served_by = r.status, r.headers.get("x-served-by")
            outcome.request_id = r.headers.get("x-request-id")
    except (aiohttp.ClientError, TimeoutError) as exc:
        outcome.error = type(exc).__name__
    outcome.seconds = time.monotonic() - outcome.started
    return outcome


@dataclass
class Fleet:
    """Guard processes a, b and c behind one HAProxy, in front of one fake upstream."""

    guards: list[Guard]
    haproxy: HAProxy
    upstream: FakeUpstream

    def guard(self, name: str) -> Guard:
        return next(g for g in self.guards if g.name == name)

    async def served_by_all(self, names: set[str] | None = None, timeout: float = 30) -> None:
        """Wait until HAProxy sends requests to every replica in `names` (all of them by default)."""
        names = names or {g.name for g in self.guards}
        seen: set[str] = set()
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as session:
            while not names <= seen:
                assert time.monotonic() < deadline, f"HAProxy only reached {seen}:\n{self.haproxy.output[-2000:]}"
                outcome = await call(session, self.haproxy.url("/v1/chat/completions"), CHAT)
                if outcome.served_by:
                    seen.add(outcome.served_by)
                await asyncio.sleep(0.05)


def start_guard(
    name: str, port: int, log_dir: Path, upstream: FakeUpstream, processes: list[Process], *serve_args: str
) -> Guard:
    """`python -m proxy serve --workers 1` in front of `upstream`; `serve_args` add to or override that."""
    guard = Guard(name, port, log_dir, "--upstream", upstream.url, "--workers", "1", *serve_args)  # type: ignore[attr-defined]
    processes.append(guard)
    return guard.start()


async def start_fleet(log_dir: Path, upstream: FakeUpstream, processes: list[Process], *serve_args: str) -> Fleet:
    # Port 0: each binds its own and says which (HAProxy's configuration is written after that).
    guards = [start_guard(name, 0, log_dir, upstream, processes, *serve_args) for name in ("a", "b", "c")]
    await all_ready(guards)
    await warmed(guards)
    haproxy = HAProxy.started(log_dir, guards, processes)
    fleet = Fleet(guards, haproxy, upstream)
    await fleet.served_by_all()
    return fleet
