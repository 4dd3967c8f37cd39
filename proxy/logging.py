"""structlog, configured once: JSON lines by default, a readable console when run in a terminal.

Every request produces one `request` event (see proxy.server.observation.record), whatever bytes it held:
a value the renderer cannot encode (a lone surrogate from a client's header or model name) is
replaced, never lost with the line. Message content and credentials are never logged;
`log.content_preview_chars` opts in to short previews of what was removed.

The console form puts the summary on the first line, in reading order, and what was removed in
an aligned, indented block below it:

    2026-11-22T10:00:00Z warning request  outcome=trimmed model=gpt-4 tokens_before=21505 ...
        messages 1-138   138 dropped    14,021 tokens  drop_oldest_turns
        message 139      tool truncated  2,310 tokens  shrink_tool_results
"""

from __future__ import annotations

import contextvars
import logging
import sys
import time
from typing import Any

import orjson
import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}


def configure_logging(fmt: str = "auto", level: str = "info", stream: Any = None, **bound: Any) -> None:
    """Configure structlog once; `bound` values (e.g. `worker=2`) go on every line."""
    global _request_lines
    stream = stream or sys.stderr
    console = fmt == "console" or (fmt == "auto" and hasattr(stream, "isatty") and stream.isatty())
    _request_lines = None if console else _JsonLines(stream, _LEVELS[level], bound)
    renderer: Any = ConsoleRenderer() if console else structlog.processors.JSONRenderer(render_json)
    processors: list[Any] = [structlog.contextvars.merge_contextvars]
    if bound:
        processors.append(_Bind(bound))
    processors += [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
        renderer,
    ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(stream),
        cache_logger_on_first_use=True,
    )


class _JsonLines:
    """The JSON chain below without structlog's per-call machinery, for the one line per request:
    the same fields in the same order (the call's, `event`, the context's, the bound ones, `level`,
    `timestamp`), rendered by the same `render_json`, printed by the same `PrintLogger` (its lock
    keeps lines from threads whole)."""

    def __init__(self, stream: Any, level: int, bound: dict[str, Any]) -> None:
        self.level = level
        self.bound = bound
        self.context = _ContextFields()
        self.clock = _UtcClock()
        self.printer = structlog.PrintLogger(stream)

    def write(self, warning: bool, event: str, fields: dict[str, Any]) -> None:
        if (logging.WARNING if warning else logging.INFO) < self.level:
            return
        line = dict(fields)
        line["event"] = event
        self.context.merge(line)
        for key, value in self.bound.items():
            line.setdefault(key, value)
        line["level"] = "warning" if warning else "info"
        line["timestamp"] = self.clock.now()
        self.printer.msg(render_json(line))


_Order = tuple[tuple[str, contextvars.ContextVar[Any]], ...]  # (key in the line, variable)


class _ContextFields:
    """structlog's `merge_contextvars` for the request line: the same values in the same order,
    read from structlog's own context variables (a handful) instead of by iterating every variable
    of the request's context (asyncio's and aiohttp's too), which cost more than the rest of the line.

    A context iterates its variables in the order of their hashes (a hash array mapped trie), the
    same relative order whatever else it holds; that order is worked out once, in an empty context,
    whenever structlog has made a new variable. A structlog without its table of variables is merged
    by its own processor."""

    def __init__(self) -> None:
        self.order: _Order = ()
        self.known = -1

    def merge(self, line: dict[str, Any]) -> None:
        variables: dict[str, contextvars.ContextVar[Any]] | None = getattr(structlog.contextvars, "_CONTEXT_VARS", None)
        if variables is None:
            structlog.contextvars.merge_contextvars(None, "", line)
            return
        if len(variables) != self.known:
            self.order, self.known = _iteration_order(list(variables.values())), len(variables)
        for key, variable in self.order:
            value = variable.get(Ellipsis)  # unset, or cleared (structlog sets Ellipsis): not merged
            if value is not Ellipsis:
                line.setdefault(key, value)


def _iteration_order(
    variables: list[contextvars.ContextVar[Any]],
) -> tuple[tuple[str, contextvars.ContextVar[Any]], ...]:
    """`variables` (structlog's, named with its prefix) in the order a context iterates them."""
    prefix = structlog.contextvars.STRUCTLOG_KEY_PREFIX

    def set_all() -> None:
        for variable in variables:
            variable.set(None)

    context = contextvars.Context()
    context.run(set_all)
    return tuple((v.name[len(prefix) :], v) for v in context if v.name.startswith(prefix))


class _UtcClock:
    """structlog's `TimeStamper(fmt="iso", utc=True)` text (`datetime.now(timezone.utc).isoformat()`
    with `Z`: microseconds, left out when zero) with the date and time of day formatted once a second."""

    def __init__(self) -> None:
        self.second, self.prefix = -1, ""

    def now(self) -> str:
        second, nanoseconds = divmod(time.time_ns(), 1_000_000_000)  # datetime.now floors to microseconds too
        if second != self.second:
            self.second, self.prefix = second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        micro = nanoseconds // 1000
        return f"{self.prefix}.{micro:06d}Z" if micro else f"{self.prefix}Z"


_request_lines: _JsonLines | None = None


def log_request_line(log: Any, warning: bool, event: str, fields: dict[str, Any]) -> None:
    """`log.warning(event, **fields)` or `log.info(...)`: for JSON output as configured by
    `configure_logging`, the same line at about a third of the cost (it is written for every request)."""
    if _request_lines is None:
        (log.warning if warning else log.info)(event, **fields)
    else:
        _request_lines.write(warning, event, fields)


class _Bind:
    def __init__(self, values: dict[str, Any]) -> None:
        self.values = values

    def __call__(self, logger: Any, name: str, event: dict[str, Any]) -> dict[str, Any]:
        for key, value in self.values.items():
            event.setdefault(key, value)
        return event


def render_json(event: Any, **_: Any) -> str:
    try:
        return orjson.dumps(event, default=str).decode()
    except TypeError:  # a lone surrogate, or an integer beyond 64 bits: replace, keep the line
        return orjson.dumps(_printable(event), default=str).decode()


def _printable(value: Any) -> Any:
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {_printable(str(k)): _printable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_printable(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 2**63:
        return str(value)
    return value


_LEAD = ("timestamp", "level", "event")


# Control characters (C0, DEL, C1) and Unicode's line and paragraph separators, written as escapes on
# the console: a value a client wrote (a model name, a path) cannot start a line of its own or move
# the cursor (a `\n` and an ANSI sequence could otherwise forge a whole line).
_CONSOLE_ESCAPES = {
    code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
    for code in (*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029)
}
_CONSOLE_ESCAPES_IN_TRACEBACKS = {code: text for code, text in _CONSOLE_ESCAPES.items() if code != 0x0A}


def console_text(text: str) -> str:
    """`text` with every control character written as its escape (`\x1b`, `\x0a`)."""
    return text.translate(_CONSOLE_ESCAPES)


class ConsoleRenderer:
    """Summary first, in the order the event gives it; removals as an aligned block. Every value
    is one line: control characters in it are written as escapes."""

    def __call__(self, logger: Any, name: str, event: dict[str, Any]) -> str:
        event = _printable(dict(event))
        removed = event.pop("removed", None)
        exc = event.pop("exception", None)
        head = " ".join(console_text(str(event.pop(k))) for k in _LEAD if k in event)
        fields = " ".join(f"{console_text(str(k))}={console_text(_short(v))}" for k, v in event.items())
        lines = [f"{head}  {fields}"]
        if isinstance(removed, list) and removed:
            rows = [[console_text(cell) for cell in _removal_row(r)] for r in removed if isinstance(r, dict)]
            widths = [max(len(row[i]) for row in rows) for i in range(4)]
            for row in rows:
                lines.append("    " + "  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row)).rstrip())
        if exc:  # a traceback keeps its lines; nothing else in it may move the cursor
            lines.append(str(exc).translate(_CONSOLE_ESCAPES_IN_TRACEBACKS))
        return "\n".join(lines)


def _removal_row(entry: dict[str, Any]) -> list[str]:
    what = str(entry.get("what", ""))
    count = entry.get("count")
    how = f"{count} {entry.get('kind', '')}" if count else f"{entry.get('role') or ''} {entry.get('kind', '')}".strip()
    tokens = entry.get("tokens")
    return [what, how, f"{tokens:,} tokens" if isinstance(tokens, int) else "", str(entry.get("strategy", ""))]


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_short(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_short(v) for v in value) + "]"
    return str(value)


def get_logger(name: str = "context-guard") -> Any:
    return structlog.get_logger(name)
