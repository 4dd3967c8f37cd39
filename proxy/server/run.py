"""`context-guard serve`: build everything once, then serve until interrupted."""

from __future__ import annotations

from aiohttp import web

from proxy.guard import Guard
from proxy.logging import configure_logging, get_logger
from proxy.server.app import create_app
from proxy.settings import Settings


def serve(settings: Settings) -> None:
    configure_logging(settings.log_format, settings.log_level)
    guard = Guard(settings)  # loads encodings and the model map: a missing file fails here, at start
    app = create_app(settings, guard)
    log = get_logger()
    upstreams = {name: u.base_url for name, u in settings.upstreams.items()}
    log.info(
        "listening",
        host=settings.host,
        port=settings.port,
        config=settings.source,
        mode=settings.mode,
        upstreams=upstreams,
        pipeline=[strategy.name for strategy in settings.trim.pipeline],
    )
    # handler_cancellation: a client that disconnects cancels its handler, which closes the upstream call.
    web.run_app(app, host=settings.host, port=settings.port, handler_cancellation=True, access_log=None, print=None)
