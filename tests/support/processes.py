"""Real processes for tests: `python -m proxy serve`, redis-server, haproxy, on 127.0.0.1.

Each is started on a port the test chose, its output goes to a file (a pipe could fill and stall
it), every wait is bounded, and `stop()`/`kill()` always leave no process behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.processes import PortTaken, free_port, on_free_port, stop
from tests.support.upstream import FakeUpstream

__all__ = ["Guard", "PortTaken", "Process", "free_port", "listens", "on_free_port"]

ROOT = Path(__file__).parents[2]


def listens(pid: int, port: int) -> bool:
    """Whether process `pid` itself listens on TCP `port` of 127.0.0.1 (Linux's /proc): not
    another process that took the port first."""
    sockets = set()
    with contextlib.suppress(FileNotFoundError):
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    sockets.add(target[len("socket:[") : -1])
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, state, inode = fields[1], fields[3], fields[9]
        if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port and inode in sockets:  # 0A: LISTEN
            return True
    return False


class Process:
    """One child process with its output in `log_path`."""

    def __init__(self, name: str, args: list[str], log_path: Path, env: dict[str, str] | None = None) -> None:
        self.name, self.args, self.log_path = name, args, log_path
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Process:
        with open(self.log_path, "ab") as out:
            self.popen = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT, env=self.env, cwd=ROOT)
        return self

    @property
    def pid(self) -> int:
        assert self.popen is not None
        return self.popen.pid

    def signal(self, signum: int) -> None:
        assert self.popen is not None
        self.popen.send_signal(signum)

    def wait(self, timeout: float) -> int:
        assert self.popen is not None
        return self.popen.wait(timeout)

    async def exited(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        assert self.popen is not None
        while self.popen.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} still running after {timeout} s")
            await asyncio.sleep(0.05)
        return self.popen.returncode

    def kill(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.kill()
            self.popen.wait(10)

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM, then SIGKILL if it has not exited within `timeout`."""
        if self.popen is not None:
            stop(self.popen, timeout)

    @property
    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class Guard(Process):
    """`python -m proxy serve` on `port`; `events()` reads its JSON log lines.

    With `port` 0 the process binds a port of its own choosing, so no other process
    can take it first; `until_ready` learns it from the `listening` line (`started` with workers),
    and a restart of the same `Guard` asks for that port again."""

    def __init__(self, name: str, port: int, log_dir: Path, *serve_args: str, env: dict[str, str] | None = None):
        args = [sys.executable, "-m", "proxy", "serve", "--port", str(port), *serve_args]
        super().__init__(name, args, log_dir / f"{name}.log", {"PYTHONPATH": str(ROOT), **(env or {})})
        self.port = port

    def url(self, path: str) -> str:
        assert self.port, f"{self.name}'s port is known once it is ready"
        return f"http://127.0.0.1:{self.port}{path}"

    def _learn_port(self) -> None:
        for event in self.events():
            if event.get("event") in ("listening", "started") and event.get("port"):
                self.port = int(event["port"])
                self.args[self.args.index("--port") + 1] = str(self.port)
                return

    async def until_ready(self, timeout: float = 90, path: str = "/readyz") -> None:
        deadline = time.monotonic() + timeout
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                assert self.popen is not None
                if self.popen.poll() is not None:
                    raise RuntimeError(f"{self.name} exited with {self.popen.returncode}:\n{self.output[-3000:]}")
                if not self.port:
                    self._learn_port()
                    if not self.port:
                        await asyncio.sleep(0.1)
                        continue
                try:
                    async with session.get(self.url(path), timeout=aiohttp.ClientTimeout(total=2)) as r:
                        if r.status == 200:
                            return
                except (aiohttp.ClientError, TimeoutError):
                    pass
                await asyncio.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready within {timeout} s:\n{self.output[-3000:]}")

    async def logged(self, name: str, timeout: float = 60) -> dict[str, Any]:
        """The first `name` event of its log, once the process has written it."""
        deadline = time.monotonic() + timeout
        while not (found := self.events(name)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} logged no {name!r} within {timeout} s:\n{self.output[-3000:]}")
            await asyncio.sleep(0.05)
        return found[0]

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        out = []
        # Read while the process writes: a last line without its newline is still being written
        # (a reader may see part of a write), so it is left for the next read.
        for line in self.output.split("\n")[:-1]:
            if line.startswith("{"):
                event = json.loads(line)
                if name is None or event.get("event") == name:
                    out.append(event)
        return out


@contextlib.asynccontextmanager
async def fake_upstream_config(folder: Path) -> AsyncIterator[Path]:
    """A guard config file in `folder` naming the suite's fake upstream (a generic upstream, JSON
    logs), which serves on a loopback port while the block runs."""
    upstream = web.AppRunner(FakeUpstream().app())
    await upstream.setup()
    try:
        await web.TCPSite(upstream, "127.0.0.1", 0).start()
        port = upstream.addresses[0][1]
        config = folder / "guard.yaml"
        config.write_text(
            f"upstreams:\n  fake:\n    base_url: http://127.0.0.1:{port}/v1\n    kind: generic\nlog:\n  format: json\n"
        )
        yield config
    finally:
        await upstream.cleanup()


@contextlib.asynccontextmanager
async def guard_before_fake_upstream(folder: Path, warm: bool) -> AsyncIterator[Guard]:
    """`context-guard serve`, one worker, ready, in front of the fake upstream; with `warm`, one chat
    answered and its peak memory reset after it, so that VmHWM is what follows."""
    async with fake_upstream_config(folder) as config:
        process = Guard("guard", 0, folder, "--config", str(config), "--workers", "1").start()
        try:
            await process.until_ready()
            if warm:
                body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "warm up"}]}
                async with aiohttp.ClientSession() as session:
                    async with session.post(process.url("/v1/chat/completions"), json=body) as answer:
                        assert answer.status == 200
                Path(f"/proc/{process.pid}/clear_refs").write_text("5")
            yield process
        finally:
            process.stop()


def status_mib(pid: int, key: str) -> float:
    """A line of /proc/<pid>/status in MiB (VmRSS now, VmHWM the peak since start or reset)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def descriptors(pid: int) -> int:
    """How many file descriptors process `pid` holds open."""
    return len(os.listdir(f"/proc/{pid}/fd"))
