"""`context-guard serve`: one process, or a supervisor and `--workers N` processes.

Settings are read from a `SettingsSource` (the config file, then the `HOST` and `PORT`
environment variables, then the command-line flags, each overriding the one before), so every
worker, and every SIGHUP reload, reads them the same way. With one worker the proxy runs in this
process, as it always has; see `proxy.server.process.lifecycle` for its start and stop, and
`proxy.server.process.workers` for the supervisor. Every log line carries `worker` (0 is the supervisor)
and `pid`.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Mapping
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


def serve(
    source: SettingsSource, *, load: Callable[[], Settings] | None = None, **flags: float | int | None
) -> int:
    """Serve until stopped; the exit status (0 after a clean stop, 2 when it could not start).
    `load`, when given, reads the settings in place of `source` (the command's built-in echo
    upstream put in) and serves them in this one process."""
    settings = source.load()  # a bad config stops here, before any process is started
    configure_logging(settings.log.format, settings.log.level)
    log = structlog.get_logger("context-guard")
    check_exposure(settings, log)
    warn_missing_keys(settings, log)
    options = server_options(settings, **flags)
    count = 1 if load is not None else options.worker_count()
    if count == 1:
        bind_worker(1)
        return asyncio.run(serve_process(load or source.load, options))

    return supervise(source, settings, options, count)


def check_exposure(settings: Settings, log: Any, env: Mapping[str, str] | None = None) -> None:
    """Refuse to start an open credential relay; warn when the operator said they mean it."""
    env = os.environ if env is None else env
    warning = settings.unauthenticated_warning(env)
    if warning is not None and settings.server.allow_unauthenticated:
        log.warning("unauthenticated", reason=warning)
    problem = settings.exposure_problem(env)
    if problem is not None:
        raise ConfigError(problem, source=settings.source, key="server.client_keys")


def warn_missing_keys(settings: Settings, log: Any, env: Mapping[str, str] | None = None) -> None:
    env = os.environ if env is None else env
    for upstream in settings.upstreams.values():
        if upstream.api_key_env and not env.get(upstream.api_key_env):
            log.warning(
                "upstream_key_missing",
                upstream=upstream.name,
                variable=upstream.api_key_env,
                effect="requests pass the client's own Authorization header on, or none",
            )
