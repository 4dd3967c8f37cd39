"""`--workers N`: a supervisor process and N serving processes on one port.

Each worker is a fresh interpreter (multiprocessing's "spawn": nothing is shared but the port)
with its own event loop, bound with SO_REUSEPORT, so the kernel spreads new connections across
them. The supervisor serves nothing. It checks the port is free before starting anyone (a busy
port is one line and exit status 2), starts the workers and waits until each listens; then it
forwards SIGTERM/SIGINT (every worker drains, see `proxy.server.process.lifecycle`) and SIGHUP (every
worker reloads its config), and starts a new worker in place of one that dies. A worker that
dies before it listens stops the whole start, with its exit status. It also makes the private
directory where the workers answer each other's page of recent decisions (`proxy.server.observation.peers`),
and removes it when it stops.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import replace
from multiprocessing.connection import wait
from multiprocessing.context import SpawnProcess
from multiprocessing.synchronize import Event
from types import FrameType

import structlog

from proxy.config.settings import Settings
from proxy.config.source import SettingsSource
from proxy.logging import configure_logging, get_logger
from proxy.server.observation.peers import Peers
from proxy.server.process.lifecycle import (
    EXIT_CANNOT_START,
    EXIT_OK,
    ServerOptions,
    Supervised,
    announce,
    serve_process,
)

START_TIMEOUT_SECONDS = 120.0
# A worker that keeps dying is not restarted for ever: this many deaths in a minute stop the service.
MAX_RESTARTS_PER_MINUTE = 5
_POLL_SECONDS = 0.2


def bind_worker(worker: int) -> None:
    """Say on every log line of this process which worker wrote it, and write each line whole.

    Workers share one standard error. structlog prints a line and its newline in two writes,
    which PYTHONUNBUFFERED (write-through) would send as two system calls, and lines from two
    workers could then interleave; line buffering sends each line in one.
    """
    structlog.contextvars.bind_contextvars(worker=worker, pid=os.getpid())
    if isinstance(sys.stderr, io.TextIOWrapper):
        sys.stderr.reconfigure(line_buffering=True, write_through=False)


def supervise(source: SettingsSource, settings: Settings, options: ServerOptions, count: int) -> int:
    log = get_logger()
    bind_worker(0)
    port = _claim_port(settings.server.host, settings.server.port)
    if isinstance(port, str):
        log.error("cannot_listen", host=settings.server.host, port=settings.server.port, reason=port)
        return EXIT_CANNOT_START
    source = replace(source, port=port)  # port 0 becomes one port that every worker shares
    pending: list[signal.Signals] = []

    def on_signal(signum: int, _: FrameType | None) -> None:
        pending.append(signal.Signals(signum))

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, on_signal)
    try:
        sockets: str | None = tempfile.mkdtemp(prefix="context-guard-workers-")  # mode 0700
    except OSError as exc:  # no writable temporary directory: each worker's page shows its own decisions
        log.warning("page_per_worker", reason=str(exc))
        sockets = None
    try:
        return _run_pool(_Pool(source, options, settings, sockets, count), options, settings, port, pending)
    finally:
        if sockets is not None:
            shutil.rmtree(sockets, ignore_errors=True)


def _run_pool(pool: _Pool, options: ServerOptions, settings: Settings, port: int, pending: list[signal.Signals]) -> int:
    log, count = get_logger(), pool.count
    for worker in range(1, count + 1):
        pool.start(worker)
    status = pool.wait_started(pending)
    if status is not None:
        exits = pool.stop_all(options, signal.SIGTERM)
        log.info("stopped", before="all workers listened", workers=count, exit_codes=exits)
        return status
    log.info("started", workers=count, host=settings.server.host, port=port, pids=pool.pids())
    announce(settings, port, count)
    stop_reason = pool.run(pending)
    exits = pool.stop_all(options, stop_reason or signal.SIGTERM)
    if stop_reason is None:
        return 1
    log.info("stopped", signal=stop_reason.name, workers=count, exit_codes=exits)
    return EXIT_OK if all(code == 0 for code in exits.values()) else 1


class _Pool:
    def __init__(
        self, source: SettingsSource, options: ServerOptions, settings: Settings, sockets: str | None, count: int
    ) -> None:
        self.source, self.options, self.settings = source, options, settings
        self.sockets, self.count = sockets, count
        self.context = multiprocessing.get_context("spawn")
        self.processes: dict[int, SpawnProcess] = {}
        self.ready: dict[int, Event] = {}
        self.deaths: list[float] = []
        self.log = get_logger()

    def start(self, worker: int) -> None:
        ready = self.context.Event()
        peers = Peers(self.sockets, worker, self.count) if self.sockets is not None else None
        process = self.context.Process(
            target=_worker_main,
            args=(self.source, self.options, self.settings, Supervised(worker, os.getpid(), ready.set, peers)),
            name=f"context-guard-worker-{worker}",
        )
        process.start()
        self.processes[worker], self.ready[worker] = process, ready

    def pids(self) -> dict[str, int | None]:
        return {str(worker): process.pid for worker, process in self.processes.items()}

    def wait_started(self, pending: list[signal.Signals]) -> int | None:
        """None once every worker listens; else the exit status to stop with."""
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not all(event.is_set() for event in self.ready.values()):
            for worker, process in self.processes.items():
                if not process.is_alive() and not self.ready[worker].is_set():
                    self.log.error("worker_failed_to_start", failed_worker=worker, exit_code=process.exitcode)
                    return process.exitcode or EXIT_CANNOT_START
            if any(s in (signal.SIGTERM, signal.SIGINT) for s in pending) or time.monotonic() > deadline:
                return EXIT_CANNOT_START if time.monotonic() > deadline else EXIT_OK
            time.sleep(_POLL_SECONDS)
        return None

    def run(self, pending: list[signal.Signals]) -> signal.Signals | None:
        """Forward reloads and replace dead workers until asked to stop: the stopping signal, or
        None when workers keep dying."""
        while True:
            wait([p.sentinel for p in self.processes.values()], timeout=_POLL_SECONDS)
            while pending:
                signum = pending.pop(0)
                if signum != signal.SIGHUP:
                    return signum
                self.log.info("reload_requested", workers=len(self.processes))
                self.signal_all(signal.SIGHUP)
            for worker, process in list(self.processes.items()):
                if process.exitcode is not None and not self.replace(worker, process.exitcode):
                    return None

    def replace(self, worker: int, exit_code: int) -> bool:
        """Start a new worker in place of a dead one; False when too many died this last minute."""
        now = time.monotonic()
        self.deaths = [t for t in self.deaths if now - t < 60] + [now]
        if len(self.deaths) > MAX_RESTARTS_PER_MINUTE:
            self.log.error("workers_keep_dying", died_worker=worker, exit_code=exit_code, deaths=len(self.deaths))
            return False
        self.log.warning("worker_died", died_worker=worker, exit_code=exit_code, restarting=True)
        self.start(worker)
        return True

    def signal_all(self, signum: signal.Signals) -> None:
        for process in self.processes.values():
            if process.pid is not None and process.exitcode is None:
                os.kill(process.pid, signum)

    def stop_all(self, options: ServerOptions, signum: signal.Signals) -> dict[str, int | None]:
        """Ask every worker to drain, wait for the drain to finish, and kill what outlives it."""
        self.signal_all(signum)
        deadline = time.monotonic() + options.drain_delay_seconds + options.shutdown_grace_seconds + 10
        for process in self.processes.values():
            process.join(max(0.0, deadline - time.monotonic()))
        for worker, process in self.processes.items():
            if process.exitcode is None:
                self.log.error("worker_killed", killed_worker=worker, reason="did not stop within its drain time")
                process.kill()
                process.join(5)
        return {str(worker): process.exitcode for worker, process in self.processes.items()}


def _claim_port(host: str, port: int) -> int | str:
    """The port to serve on (port 0 resolved), or why it cannot be had. Bound without SO_REUSEPORT,
    so another process's listener on it is found even if it allows sharing."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
        return int(probe.getsockname()[1])


def _worker_main(source: SettingsSource, options: ServerOptions, settings: Settings, supervised: Supervised) -> None:
    """A spawned worker's start: its log lines say which worker it is, then it serves."""
    import asyncio

    configure_logging(settings.log.format, settings.log.level)
    bind_worker(supervised.worker)
    raise SystemExit(asyncio.run(serve_process(source.load, options, supervised)))
