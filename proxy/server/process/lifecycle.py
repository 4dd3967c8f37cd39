"""One serving process from start to clean stop: listen, reload on SIGHUP, drain on SIGTERM.

Starting: the config and the model map load, and the files of the configured vocabularies are
checked (a missing one is one log line and exit status 2); the process then listens at once and
loads the vocabularies off the loop (about half a second each: the configured models' and those
`tokenizers.preload` names, `proxy.tokenizers.at_start`), `/readyz` answering 503 "tokenizers are
still loading" until they are in. A request that needs one meanwhile waits for it. The event
loop's lag is watched from the start (`proxy.server.process.loop_lag`).

Stopping without losing a request (SIGTERM or SIGINT):
1. `/readyz` turns 503 at once, so load balancers take the process out of rotation;
2. for `drain_delay_seconds`, new connections are still accepted and served (a load balancer
   needs a few health checks to notice), every response now closing its connection;
3. the listener closes; requests and streams in flight run to completion, for up to
   `shutdown_grace_seconds`, after which any left are cancelled;
4. one `stopped` line says what was drained, and the process exits 0.

SIGHUP re-reads the config file and swaps in a new `Gateway` built from it; requests in flight
keep the one they started with, connections stay open. A config that does not load is refused
with one log line, and the old one stays. Listening address, port and body limit need a restart.

A port that is taken is one log line and exit status 2.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from proxy.config.settings import Settings
from proxy.errors import ConfigError
from proxy.logging import get_logger
from proxy.server.backends.models import Models
from proxy.server.observation.health import HEALTH, os_error_reason
from proxy.server.observation.peers import Peers, serve_own
from proxy.server.observation.recent import GATHER, RECENT
from proxy.server.process.app import DRAIN, build_gateway, create_app
from proxy.server.process.loop_lag import LoopWatch, sized_reads_on_connect
from proxy.server.request.gateway import GATEWAY
from proxy.server.threads.collector import collect_young_less_often
from proxy.tokenizers.at_start import vocabularies_at_start
from proxy.tokenizers.malloc import one_arena
from proxy.tokenizers.vocabularies import TokenizerUnavailable

EXIT_OK, EXIT_CANNOT_START = 0, 2
# Once this process's own wait for in-flight requests is over, aiohttp's shutdown only has to
# close what is left; this bounds that step.
_FINAL_CLOSE_SECONDS = 1.0
_SWITCH_INTERVAL_SECONDS = 0.0005


@dataclass(frozen=True, slots=True)
class ServerOptions:
    """`server.workers`, `server.drain_delay_seconds` and `server.shutdown_grace_seconds`."""

    workers: int | None = None  # None: the cores this process may use
    drain_delay_seconds: float = 5.0
    shutdown_grace_seconds: float = 30.0

    def __post_init__(self) -> None:
        if self.workers is not None and not 1 <= self.workers <= 256:
            raise ValueError(f"server.workers must be between 1 and 256, not {self.workers}")
        if not 0 <= self.drain_delay_seconds <= 600:
            raise ValueError(f"server.drain_delay_seconds must be between 0 and 600, not {self.drain_delay_seconds}")
        if not 0 <= self.shutdown_grace_seconds <= 3600:
            raise ValueError(
                f"server.shutdown_grace_seconds must be between 0 and 3600, not {self.shutdown_grace_seconds}"
            )

    def worker_count(self) -> int:
        return self.workers if self.workers is not None else available_cores()


def available_cores() -> int:
    """CPUs this process may run on, capped by a cgroup CPU quota (a container's CPU limit)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    with contextlib.suppress(OSError, ValueError):
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()[:2]  # noqa: SIM115  # one short read
        if quota != "max":
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    return max(1, cores)


@dataclass(frozen=True, slots=True)
class Supervised:
    """Worker `worker` of the pool a supervisor (`parent_pid`) runs (`proxy.server.process.workers`):
    it shares the port with the other workers (SO_REUSEPORT), calls `ready` once its vocabularies
    are in, stops when its supervisor is gone, and answers its `peers`' pages (None: each worker's
    page shows its own decisions)."""

    worker: int
    parent_pid: int
    ready: Callable[[], None]
    peers: Peers | None = None


async def serve_process(
    load: Callable[[], Settings], options: ServerOptions, supervised: Supervised | None = None
) -> int:
    """Serve until stopped, as the module docstring says: alone, or as a `supervised` worker.
    The exit status: 0 after a clean stop, 2 when it could not start."""

    # A thread working on a large body holds the GIL for up to the switch interval each time the
    # loop wants it back (after every socket call): 5 ms by default, which adds tens of ms to a
    # small request. At 0.5 ms, its p99 while 10 MB bodies are counted fell from 100-120 ms to
    # 40-45 ms on the shared 2-core machine (bench/changes.md).
    sys.setswitchinterval(_SWITCH_INTERVAL_SECONDS)
    one_arena()  # before the first thread: the vocabularies load on one (proxy.tokenizers.malloc)
    log = get_logger()
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    stop_signal: list[str] = []

    def on_stop(signum: signal.Signals) -> None:
        if not stop_signal:
            stop_signal.append(signum.name)
            stop.set()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_stop, signum)
    loop.add_signal_handler(signal.SIGHUP, lambda: None)  # until the app exists, a reload has nothing to replace

    try:
        settings = load()
        # The model map loads and the configured vocabularies' files are checked here; a missing
        # one fails the start. The vocabularies themselves load once the process listens.
        guard = await asyncio.to_thread(load_models, settings)
    except ConfigError as exc:
        log.error("cannot_start", reason=str(exc))
        return EXIT_CANNOT_START
    if stop.is_set():  # stopped while loading: there is nothing to drain
        log.info("stopped", signal=stop_signal[0], in_flight_at_close=0)
        return EXIT_OK
    app = create_app(settings, guard)
    watch = LoopWatch(app[GATEWAY].metrics.loop_lag, loop)  # the metrics outlive a reload: so does the watch
    watch.start()
    peers = supervised.peers if supervised is not None else None
    if peers is not None:  # one of several workers: its page shows every worker's decisions
        app[GATHER] = peers.gather
    runner = web.AppRunner(
        app, handle_signals=False, handler_cancellation=True, access_log=None, shutdown_timeout=_FINAL_CLOSE_SECONDS
    )
    await runner.setup()
    server = runner.server
    if server is not None:  # the loop's reads sized by how many connections share its turns
        watch.connections = lambda: len(server.connections)
        server.connection_made = sized_reads_on_connect(server.connection_made, watch.connections)  # type: ignore[method-assign]
    site = web.TCPSite(runner, settings.server.host, settings.server.port, reuse_port=supervised is not None or None)
    try:
        await site.start()
    except OSError as exc:
        log.error("cannot_listen", host=settings.server.host, port=settings.server.port, reason=os_error_reason(exc))
        await runner.cleanup()
        watch.stop()
        return EXIT_CANNOT_START
    own = await _answer_peers(app, peers) if peers is not None else None

    reloading: set[asyncio.Task[None]] = set()
    one_at_a_time = asyncio.Lock()  # two quick SIGHUPs: the second reload starts after the first

    async def reload() -> None:
        async with one_at_a_time:
            await reload_config(app, load)

    def on_reload() -> None:
        task = loop.create_task(reload())
        reloading.add(task)  # the loop keeps only a weak reference to a task
        task.add_done_callback(reloading.discard)

    loop.add_signal_handler(signal.SIGHUP, on_reload)
    log.info(
        "listening",
        host=settings.server.host,
        port=runner.addresses[0][1] if runner.addresses else settings.server.port,
        config=settings.source,
        mode=settings.trim.mode,
        upstreams={name: u.base_url for name, u in settings.upstreams.items()},
        pipeline=list(settings.trim.pipeline),
    )
    if supervised is None:
        announce(settings, runner.addresses[0][1] if runner.addresses else settings.server.port, 1)
    # A worker reports itself started once its vocabularies are in: one that cannot load them
    # fails the supervisor's start instead of being restarted over and over.
    ready = supervised.ready if supervised is not None else None
    loading = loop.create_task(_load_tokenizers(app, guard, stop, ready))
    watchdog = loop.create_task(_watch_parent(supervised.parent_pid, stop)) if supervised is not None else None
    await stop.wait()
    if watchdog is not None:
        watchdog.cancel()
    if not loading.done():
        loading.cancel()  # stopped while loading: the load's thread finishes on its own
    elif loading.result() is not None:  # a vocabulary that did not load: a failed start, already logged
        await runner.cleanup()
        watch.stop()
        return EXIT_CANNOT_START
    drained = await drain(app, runner, site, options)
    watch.stop()
    if own is not None:
        await own.cleanup()
    log.info("stopped", signal=stop_signal[0] if stop_signal else "parent_exited", **drained)
    return EXIT_OK


def load_models(settings: Settings) -> Models:
    """The model map loaded and the configured vocabularies' files checked, as a process starts (a
    `ConfigError` for one missing); the vocabularies themselves load later (`Models.load_configured`)."""
    return Models(settings, None, False)


def load_vocabularies(guard: Models) -> None:
    """The vocabularies a process loads before it is ready: the configured models' and what
    `tokenizers.preload` names (`proxy.tokenizers.at_start`). Those `auto` picks whose files are
    not on disk are left to load (and fail) on first use, as before; a named one fails the start."""
    guard.load_configured()
    settings, tokenizers = guard.settings, guard.tokenizers
    providers = [upstream.provider for upstream in settings.upstreams.values()]
    preload = settings.tokenizers.preload
    for spec in vocabularies_at_start(preload, providers, lambda model: guard.registry.profile(model).tokenizer):
        try:
            tokenizers.check(spec)
        except TokenizerUnavailable:
            if preload != "auto":
                raise
            continue
        tokenizers.get(spec)


def announce(settings: Settings, port: int, workers: int, stream: Any = None) -> None:
    """One line for a person at a terminal, beside the JSON lines: where the guard listens, how many
    processes serve it, where to look. Written only to a terminal, so a log pipeline reads JSON alone."""
    stream = sys.stderr if stream is None else stream
    if not (hasattr(stream, "isatty") and stream.isatty()):
        return
    host = settings.server.host
    base = f"http://{f'[{host}]' if ':' in host else host}:{port}"
    upstreams = ", ".join(u.provider.describe(name, u.base_url) for name, u in settings.upstreams.items())
    stream.write(
        f"context-guard listening on {base} ({workers} worker{'s' if workers != 1 else ''}), forwarding to "
        f"{upstreams}\n  recent decisions: {base}/context-guard/recent   health: {base}/livez, {base}/readyz"
        "   stop: Ctrl-C\n"
    )
    stream.flush()


async def _load_tokenizers(
    app: web.Application, guard: Models, stop: asyncio.Event, ready: Callable[[], None] | None
) -> str | None:
    """Load the configured vocabularies off the loop while the process already answers probes;
    `/readyz` says so until they are in. A file that is there but does not load stops the process
    (the reason, or None when all loaded)."""
    health = app[HEALTH]
    health.tokenizers_ready = False
    try:
        await asyncio.to_thread(load_vocabularies, guard)
    except ConfigError as exc:
        get_logger().error("cannot_start", reason=str(exc))
        stop.set()
        return str(exc)
    collect_young_less_often()  # from now on, while serving (proxy.server.threads.collector)
    app[GATEWAY].metrics.loop_lag.forget_recent()
    health.tokenizers_ready = True
    if ready is not None:
        ready()
    return None


async def _answer_peers(app: web.Application, peers: Peers) -> web.AppRunner | None:
    """This worker's decisions on its socket, for the others' pages; None (logged) if it cannot listen there."""
    try:
        return await serve_own(app[RECENT], peers)
    except OSError as exc:
        get_logger().warning("page_socket_failed", path=peers.socket(peers.worker), reason=os_error_reason(exc))
        return None


async def drain(
    app: web.Application, runner: web.AppRunner, site: web.TCPSite, options: ServerOptions
) -> dict[str, Any]:
    """Steps 1-3 of the module docstring; what was drained, for the `stopped` line."""
    log, tracker, started = get_logger(), app[DRAIN], time.monotonic()
    tracker.draining = True
    app[HEALTH].draining = True
    log.info("draining", in_flight=tracker.in_flight, drain_delay_seconds=options.drain_delay_seconds)
    await asyncio.sleep(options.drain_delay_seconds)
    await site.stop()
    at_close = tracker.in_flight
    served_before_close = tracker.served_while_draining
    finished = await tracker.wait_idle(options.shutdown_grace_seconds)
    unfinished = 0 if finished else tracker.in_flight
    await runner.cleanup()  # closes idle connections, cancels whatever the grace period did not see end
    return {
        "served_during_delay": served_before_close,
        "in_flight_at_close": at_close,
        "completed_after_close": at_close - unfinished,
        "cancelled": unfinished,
        "drain_seconds": round(time.monotonic() - started, 3),
    }


# What a running process reads once, at start: a reload that changes these says so in its log line.
RESTART_ONLY = (
    ("server", ("host", "port", "max_body_bytes", "body_timeout_seconds", "max_json_depth", "passthrough",
                "upstream_connections", "connection_wait_seconds", "workers", "drain_delay_seconds",
                "shutdown_grace_seconds")),
    ("log", ("format", "level")),
    ("page", ("enabled", "size")),
    ("readiness", ("require_upstreams", "reachable_within_seconds", "probe_interval_seconds", "probe_timeout_seconds")),
)  # fmt: skip


def restart_only_changes(old: Settings, new: Settings) -> list[str]:
    changed = []
    for section, keys in RESTART_ONLY:
        for key in keys:
            if getattr(getattr(old, section), key) != getattr(getattr(new, section), key):
                changed.append(f"{section}.{key}")
    return changed


async def reload_config(app: web.Application, load: Callable[[], Settings]) -> bool:
    """SIGHUP: a new Gateway from the config file, or the old one kept. True when it changed."""
    log, old = get_logger(), app[GATEWAY]
    try:
        settings = await asyncio.to_thread(load)
        guard = await asyncio.to_thread(load_models, settings)
        await asyncio.to_thread(load_vocabularies, guard)  # those loaded already are kept: milliseconds
    except Exception as exc:  # whatever stops the new config from loading, the running one stays
        reason = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
        log.error("reload_refused", reason=reason, kept=old.settings.source)
        return False

    new = build_gateway(settings, guard, previous=old)
    if new.store is not old.store:
        await new.store.open()  # `state.*` changed: connected before it serves a request
    with warnings.catch_warnings():
        # aiohttp deprecates changing a started app's state, as handlers could see it change under
        # them. Each handler reads app[GATEWAY] once, so a request keeps the gateway it began with.
        warnings.simplefilter("ignore", DeprecationWarning)
        app[GATEWAY] = new
    health = app[HEALTH]
    health.config_source = settings.source
    health.reachability.replace_upstreams({name: u.base_url for name, u in settings.upstreams.items()})
    if new.store is not old.store:
        await old.store.close()
    needs_restart = restart_only_changes(old.settings, settings)
    log.info(
        "reloaded",
        config=settings.source,
        upstreams={name: u.base_url for name, u in settings.upstreams.items()},
        **({"needs_restart": needs_restart} if needs_restart else {}),
    )
    return True


async def _watch_parent(parent_pid: int, stop: asyncio.Event) -> None:
    """A worker whose supervisor died (SIGKILL) stops too, instead of serving on unsupervised."""
    while os.getppid() == parent_pid:
        await asyncio.sleep(1.0)
    stop.set()
