"""The server processes the benchmarks start: their commands, ports, readiness and stopping.

Each server runs from a source tree (this checkout unless told otherwise) on a free port of
127.0.0.1; `started` waits until it answers 200 and stops it after: SIGTERM, a bounded wait for
it to drain and exit, then SIGKILL. Never left running, never waited on forever.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).parent.parent
T = TypeVar("T")
BENCH_MODEL = "gpt-4.1"  # bench/load.py's MODEL: named in a route, so its vocabulary loads at start


def stop(process: subprocess.Popen[bytes], timeout: float = 15.0) -> int:
    """Stop `process` (already stopped: nothing to do); its exit status."""
    if process.poll() is not None:
        return process.returncode
    process.terminate()
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait(timeout=timeout)


def free_port() -> int:
    """A port of 127.0.0.1 that nothing listens on now (bound to port 0, then closed): the one copy
    of this helper, for the benchmarks and the tests. Only for a server that must be told its port
    before it starts (redis-server, haproxy, llama-server, a benchmark's servers): another process
    may take the port between the close and the server's bind, so start such a server with
    `on_free_port`, which tries again. A server that can bind port 0 itself should (aiohttp's test
    server, `context-guard serve --port 0`, which logs the port it got)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PortTaken(RuntimeError):
    """The port a server was given was taken before it could bind it."""


def on_free_port(start: Callable[[int], T], attempts: int = 3) -> T:
    """`start(port)` on a free port; again on another when it raises `PortTaken`."""
    for attempt in range(1, attempts + 1):
        try:
            return start(free_port())
        except PortTaken:
            if attempt == attempts:
                raise
    raise AssertionError("unreachable")


def python() -> list[str]:
    return [sys.executable]


def guard_config(folder: Path, upstream_port: int) -> Path:
    """context-guard's config: everything at its defaults but the upstream, and the one model the
    benchmark sends named in a route, so its vocabulary (o200k_base) loads at start."""
    path = folder / "context-guard.yaml"
    path.write_text(
        "log:\n  format: json\n  level: info\nreadiness:\n  require_upstreams: false\n"
        f"upstreams:\n  fake:\n    base_url: http://127.0.0.1:{upstream_port}/v1\n"
        f"routes:\n  - match: {BENCH_MODEL}\n    upstream: fake\n  - match: gpt-4o\n    upstream: fake\n"
    )
    return path


def guard_command(config: Path, port: int, workers: int | None = None) -> list[str]:
    """`serve` with `workers` workers; one when None (and `serve` has the flag, whose default is
    every core: the one-worker figures must not get two by default)."""
    command = [*python(), "-m", "proxy", "serve", "--config", str(config), "--port", str(port)]
    if workers is None and supports_workers():
        workers = 1
    return [*command, "--workers", str(workers)] if workers else command


def server_command(kind: str, port: int, upstream_url: str | None = None) -> list[str]:
    """bench/servers.py's fake upstream (`upstream`), bare proxy (`bare`) or minimal proxy (`minimal`),
    the proxies in front of `upstream_url`."""
    return [*python(), str(ROOT / "bench/servers.py"), kind, str(port), *([upstream_url] if upstream_url else [])]


@functools.cache
def supports_workers() -> bool:
    out = subprocess.run([*python(), "-m", "proxy", "serve", "--help"], capture_output=True, text=True, cwd=ROOT)
    return "--workers" in out.stdout


def wait_ready(port: int, process: subprocess.Popen[bytes], timeout: float = 60, path: str = "/healthz") -> float:
    """Seconds from now until GET `path` answers 200 (polled every 5 ms)."""
    started = time.perf_counter()
    while time.perf_counter() - started < timeout:
        if process.poll() is not None:
            raise RuntimeError(f"{' '.join(map(str, process.args))} exited with {process.returncode}")  # type: ignore[arg-type]
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                if s.recv(32).startswith(b"HTTP/1.1 200"):
                    return time.perf_counter() - started
        except OSError:
            pass
        time.sleep(0.005)
    raise RuntimeError(f"port {port} did not come up in {timeout} s")


@contextmanager
def started(
    command: list[str], port: int, path: str = "/healthz", source: Path = ROOT
) -> Iterator[tuple[subprocess.Popen[bytes], float]]:
    """A server process run from the source tree `source`, answering 200 on `path`, and the seconds
    it took from exec; stopped after."""
    env = {**os.environ, "PYTHONPATH": str(source)}
    launched = time.perf_counter()
    process = subprocess.Popen(command, cwd=source, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, process, path=path)
        yield process, time.perf_counter() - launched
    finally:
        stop(process)


def cpu_seconds(pid: int, children_reaped: bool = False) -> float:
    """User + system CPU seconds of process `pid` so far (with `children_reaped`, also those of
    its children that have exited and been waited for)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if children_reaped else 0)
    return ticks / os.sysconf("SC_CLK_TCK")


def process_tree_cpu_seconds(pid: int, children_reaped: bool = False) -> float:
    """User + system CPU seconds of a process and its live children (a supervisor and its workers)."""
    total = cpu_seconds(pid, children_reaped)
    children = Path(f"/proc/{pid}/task/{pid}/children")
    if children.exists():
        for child in children.read_text().split():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # exited meanwhile
                total += process_tree_cpu_seconds(int(child), children_reaped)
    return total
