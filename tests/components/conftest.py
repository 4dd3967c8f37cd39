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
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.processes import Guard, Process, free_port
from tests.server.fake_upstream import FakeUpstream

pytestmark = pytest.mark.components


def need(binary: str) -> str:
    path = shutil.which(binary)
    if path is None:
        pytest.skip(f"{binary} is not installed (scripts/install-components.sh installs it)")
    return path


class RedisServer(Process):
    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
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

    def until_ready(self, timeout: float = 20) -> None:
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
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
    server = RedisServer(tmp_path)
    server.start()
    try:
        server.until_ready()
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
    def __init__(self, log_dir: Path, guards: list[Guard]) -> None:
        self.port = free_port()
        servers = "\n".join(f"    server {g.name} 127.0.0.1:{g.port}" for g in guards)
        config = log_dir / "haproxy.cfg"
        config.write_text(HAPROXY_CONFIG.format(port=self.port, servers=servers))
        super().__init__("haproxy", [need("haproxy"), "-db", "-f", str(config)], log_dir / "haproxy.log")

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"


@pytest.fixture
async def start_upstream() -> AsyncIterator[Any]:
    """Fake upstreams on real ports of their own (the proxies are other processes)."""
    from aiohttp import web

    runners: list[web.AppRunner] = []

    async def start() -> FakeUpstream:
        fake = FakeUpstream()
        runner = web.AppRunner(fake.app(), handler_cancellation=True)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
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


@pytest.fixture
def logs() -> Any:
    from tests.server.conftest import Logs

    return Logs()
