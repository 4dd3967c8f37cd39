"""structlog, configured once: JSON lines by default, a readable console when run in a terminal.

Every request produces one `request` event (see proxy.server.handlers). Message content and
credentials are never logged; `log.content_preview_chars` opts in to short previews of what
was removed.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import orjson
import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure_logging(fmt: str = "auto", level: str = "info", stream: Any = None) -> None:
    stream = stream or sys.stderr
    console = fmt == "console" or (fmt == "auto" and hasattr(stream, "isatty") and stream.isatty())
    renderer: Any = structlog.dev.ConsoleRenderer() if console else structlog.processors.JSONRenderer(_json)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=False,
    )


def _json(event: Any, **_: Any) -> str:
    # A trimmed request's event lists every removal; orjson renders it in a fraction of the time.
    return orjson.dumps(event, default=str).decode()


def get_logger(name: str = "context-guard") -> Any:
    return structlog.get_logger(name)
