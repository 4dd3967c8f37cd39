"""`context-guard serve`: build everything once, then serve until interrupted."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from proxy.errors import ConfigError
from proxy.guard import Guard
from proxy.logging import configure_logging, get_logger
from proxy.server.app import create_app
from proxy.settings import Settings


def serve(settings: Settings) -> None:
    configure_logging(settings.log.format, settings.log.level)
    log = get_logger()
    check_exposure(settings, log)
    for upstream in settings.upstreams.values():
        if upstream.api_key_env and not os.environ.get(upstream.api_key_env):
            log.warning(
                "upstream_key_missing",
                upstream=upstream.name,
                variable=upstream.api_key_env,
                effect="requests pass the client's own Authorization header on, or none",
            )
    guard = Guard(settings)  # loads encodings and the model map: a missing file fails here, at start
    app = create_app(settings, guard)
    upstreams = {name: u.base_url for name, u in settings.upstreams.items()}
    log.info(
        "listening",
        host=settings.server.host,
        port=settings.server.port,
        config=settings.source,
        mode=settings.trim.mode,
        upstreams=upstreams,
        pipeline=list(settings.trim.pipeline),
    )
    # handler_cancellation: a client that disconnects cancels its handler, which closes the upstream call.
    web.run_app(
        app,
        host=settings.server.host,
        port=settings.server.port,
        handler_cancellation=True,
        access_log=None,
        print=None,
    )


def check_exposure(settings: Settings, log: Any, env: Mapping[str, str] | None = None) -> None:
    """Refuse to start an open credential relay; warn when the operator said it means it."""
    env = os.environ if env is None else env
    warning = settings.unauthenticated_warning(env)
    if warning is not None and settings.server.allow_unauthenticated:
        log.warning("unauthenticated", reason=warning)
    problem = settings.exposure_problem(env)
    if problem is None:
        return
    raise ConfigError(problem, source=settings.source, key="server.client_keys")
