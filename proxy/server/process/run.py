"""`context-guard serve`: one process, or a supervisor and `--workers N` processes.

Settings are read from a `SettingsSource` (the config file, then the `HOST` and `PORT`
environment variables, then the command-line flags, each overriding the one before), so every
worker, and every SIGHUP reload, reads them the same way. Before anything starts, `start_check`
applies every rule a start has (`check-config` runs the same function and stops there). With one
worker the proxy runs in this process, as it always has; see `proxy.server.process.lifecycle` for
its start and stop, and `proxy.server.process.workers` for the supervisor. Every log line carries
`worker` (0 is the supervisor) and `pid`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from proxy.config.settings import Settings
from proxy.config.source import SettingsSource
from proxy.errors import ConfigError
from proxy.logging import configure_logging
from proxy.server.process.lifecycle import ServerOptions, serve_process
from proxy.server.process.workers import bind_worker, supervise


def server_options(settings: Settings, **flags: float | int | None) -> ServerOptions:
    """`server.workers`, `drain_delay_seconds` and `shutdown_grace_seconds`, with the command
    line's flags (`--workers`, `--drain-delay`, `--shutdown-grace`) over them."""
    server = settings.server
    values: dict[str, float | int | None] = {
        "workers": server.workers or None,  # 0: one per available core
        "drain_delay_seconds": server.drain_delay_seconds,
        "shutdown_grace_seconds": server.shutdown_grace_seconds,
    }
    values.update({name: value for name, value in flags.items() if value is not None})
    try:
        return ServerOptions(**values)  # type: ignore[arg-type]  # the keys are ServerOptions' fields
    except ValueError as exc:
        raise ConfigError(str(exc), key="--workers/--drain-delay/--shutdown-grace") from None


@dataclass(frozen=True, slots=True)
class StartCheck:
    """What `serve` decides before it starts anything, and `check-config` reports without starting:
    the settings as served, the processes' options, how many serve the port, and the warnings it
    logs at start (an event name and its fields each)."""

    settings: Settings
    options: ServerOptions
    workers: int
    warnings: tuple[tuple[str, dict[str, Any]], ...]


def start_check(
    settings: Settings,
    flags: Mapping[str, float | int | None] | None = None,
    *,
    one_process: bool = False,
    env: Mapping[str, str] | None = None,
) -> StartCheck:
    """Every rule `serve` applies to `settings` before it starts (a `ConfigError` for one it
    breaks), with the command line's `flags`; `one_process`: served in this process alone (the
    built-in echo upstream)."""
    env = os.environ if env is None else env
    problem = settings.exposure_problem(env)
    if problem is not None:
        raise ConfigError(problem, source=settings.source, key="server.client_keys")
    warnings: list[tuple[str, dict[str, Any]]] = []
    unauthenticated = settings.unauthenticated_warning(env)
    if unauthenticated is not None and settings.server.allow_unauthenticated:
        warnings.append(("unauthenticated", {"reason": unauthenticated}))
    for upstream in settings.upstreams.values():
        if upstream.api_key_env and not env.get(upstream.api_key_env):
            fields = {"upstream": upstream.name, "variable": upstream.api_key_env, "effect": KEY_MISSING_EFFECT}
            warnings.append(("upstream_key_missing", fields))
    options = server_options(settings, **(flags or {}))
    workers = 1 if one_process else options.worker_count()
    return StartCheck(settings, options, workers, tuple(warnings))


KEY_MISSING_EFFECT = "requests pass the client's own Authorization header on, or none"


def serve(
    source: SettingsSource, *, load: Callable[[], Settings] | None = None, **flags: float | int | None
) -> int:
    """Serve until stopped; the exit status (0 after a clean stop, 2 when it could not start).
    `load`, when given, reads the settings in place of `source` (the command's built-in echo
    upstream put in) and serves them in this one process."""
    # A bad config stops here, before any process is started; the rules are `start_check`'s,
    # which `check-config` runs too.
    check = start_check((load or source.load)(), flags, one_process=load is not None)
    settings = check.settings
    configure_logging(settings.log.format, settings.log.level)
    log = structlog.get_logger("context-guard")
    for event, fields in check.warnings:
        log.warning(event, **fields)
    if check.workers == 1:
        bind_worker(1)
        return asyncio.run(serve_process(load or source.load, check.options))

    return supervise(source, settings, check.options, check.workers)
