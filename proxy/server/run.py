"""`context-guard serve`: one process, or a supervisor and `--workers N` processes.

Settings are read from a `SettingsSource` (the config file, then the `HOST` and `PORT`
environment variables, then the command-line flags, each overriding the one before), so every
worker, and every SIGHUP reload, reads them the same way. With one worker the proxy runs in this
process, as it always has; see `proxy.server.lifecycle` for its start and stop, and
`proxy.server.workers` for the supervisor. Every log line carries `worker` (0 is the supervisor)
and `pid`.
"""

from __future__ import annotations

import asyncio
import io
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace

import structlog

from proxy.errors import ConfigError
from proxy.logging import configure_logging
from proxy.server.lifecycle import ServerOptions, serve_process
from proxy.settings import Settings, load_settings


@dataclass(frozen=True, slots=True)
class SettingsSource:
    """Where the settings come from; `load()` reads them afresh (at start and on SIGHUP)."""

    config: str | None = None
    upstream: str | None = None  # --upstream: every route goes to this base URL
    host: str | None = None
    port: int | None = None

    def load(self, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env
        settings = load_settings(self.config)
        if self.upstream:
            try:
                settings = settings.with_upstream_url(self.upstream)
            except ValueError as exc:
                raise ConfigError(str(exc), key="--upstream") from None
        host = self.host or env.get("HOST") or settings.host
        port = self.port if self.port is not None else _env_port(env) if env.get("PORT") else settings.port
        return replace(settings, host=host, port=port)


def _env_port(env: Mapping[str, str]) -> int:
    text = env["PORT"].strip()
    if not text.isdigit() or int(text) > 65535:
        raise ConfigError(f"must be a port number (0-65535), not {text!r}", source="environment", key="PORT")
    return int(text)


def bind_worker(worker: int) -> None:
    """Say on every log line of this process which worker wrote it, and write each line whole.

    Workers share one standard error. structlog prints a line and its newline in two writes,
    which PYTHONUNBUFFERED (write-through) would send as two system calls, and lines from two
    workers could then interleave; line buffering sends each line in one.
    """
    structlog.contextvars.bind_contextvars(worker=worker, pid=os.getpid())
    if isinstance(sys.stderr, io.TextIOWrapper):
        sys.stderr.reconfigure(line_buffering=True, write_through=False)


def serve(source: SettingsSource, options: ServerOptions) -> int:
    """Serve until stopped; the exit status (0 after a clean stop, 2 when it could not start)."""
    settings = source.load()  # a bad config stops here, before any process is started
    configure_logging(settings.log_format, settings.log_level)
    count = options.worker_count()
    if count == 1:
        bind_worker(1)
        return asyncio.run(serve_process(source.load, options))
    from proxy.server.workers import supervise

    return supervise(source, settings, options, count)
