"""The request line's fast path writes what structlog's JSON chain writes for the same call."""

from __future__ import annotations

import contextvars
import datetime
import io
import json
import random
import time
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

import proxy.logging
from proxy.logging import configure_logging, get_logger, log_request_line

FIELDS: dict[str, Any] = {
    "request_id": "req-1",
    "status": 200,
    "model": "gpt-4.1",
    "removed": [{"index": 3, "role": "tool", "tokens": 120}],
    "client": "\ud800 lone",  # a surrogate from a client's header: replaced, the line kept
}


@pytest.fixture
def stream(monkeypatch: pytest.MonkeyPatch) -> Iterator[io.StringIO]:
    """A stream to configure logging with; the configuration before is restored after."""
    monkeypatch.setattr(proxy.logging, "_request_lines", proxy.logging._request_lines)
    config = structlog.get_config()
    yield io.StringIO()
    structlog.contextvars.clear_contextvars()
    structlog.configure(**config)


def lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def without_time(line: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in line.items() if k != "timestamp"]


class TestRequestLine:
    @pytest.mark.parametrize("warning", [False, True])
    def test_it_has_the_fields_and_order_of_the_structlog_line_for_the_same_call(self, stream, warning):
        configure_logging("json", "info", stream, region="eu")
        structlog.contextvars.bind_contextvars(worker=2, pid=41)
        log = get_logger()
        (log.warning if warning else log.info)("request", **FIELDS)
        log_request_line(log, warning, "request", FIELDS)
        chain, fast = lines(stream)
        assert without_time(fast) == without_time(chain)
        assert list(fast) == list(chain)

    def test_its_timestamp_is_iso_utc_with_a_z(self, stream):
        configure_logging("json", "info", stream)
        log_request_line(get_logger(), False, "request", FIELDS)
        assert lines(stream)[0]["timestamp"].endswith("Z") and "T" in lines(stream)[0]["timestamp"]

    def test_a_level_above_info_drops_the_info_line_and_keeps_the_warning(self, stream):
        configure_logging("json", "warning", stream)
        log_request_line(get_logger(), False, "request", FIELDS)
        log_request_line(get_logger(), True, "request", FIELDS)
        assert [line["level"] for line in lines(stream)] == ["warning"]

    def test_the_console_format_goes_through_the_logger(self, stream):
        configure_logging("console", "info", stream)
        log_request_line(get_logger(), False, "request", {"status": 200})
        assert "request" in stream.getvalue() and "status=200" in stream.getvalue()

    def test_the_callers_fields_are_left_as_they_were(self, stream):
        configure_logging("json", "info", stream)
        fields = dict(FIELDS)
        log_request_line(get_logger(), False, "request", fields)
        assert fields == FIELDS

    def test_every_context_field_comes_in_the_order_structlogs_chain_writes_it(self, stream):
        configure_logging("json", "info", stream)
        others = [contextvars.ContextVar(f"other_{i}") for i in range(40)]  # asyncio's, aiohttp's, ...
        for i, other in enumerate(others):
            other.set(i)
        names = [f"field_{i}" for i in range(24)]
        random.Random(7).shuffle(names)
        structlog.contextvars.bind_contextvars(**{name: name.upper() for name in names})
        structlog.contextvars.unbind_contextvars(names[0])  # cleared: in neither line
        log = get_logger()
        log.info("request", **FIELDS)
        log_request_line(log, False, "request", FIELDS)
        chain, fast = lines(stream)
        assert list(fast) == list(chain) and names[0] not in fast

    def test_a_field_bound_after_the_first_line_is_in_the_next_one(self, stream):
        configure_logging("json", "info", stream)
        log_request_line(get_logger(), False, "request", {"status": 200})
        structlog.contextvars.bind_contextvars(late_field=1)
        log_request_line(get_logger(), False, "request", {"status": 200})
        first, second = lines(stream)
        assert "late_field" not in first and second["late_field"] == 1


class TestUtcClock:
    @pytest.mark.parametrize(
        "nanoseconds",
        [1_795_000_000_000_000_000, 1_795_000_000_000_999_999, 1_795_000_000_123_456_789, 86_399_999_999_999],
    )
    def test_it_writes_what_structlogs_iso_utc_stamp_writes_for_the_same_instant(self, monkeypatch, nanoseconds):
        monkeypatch.setattr(time, "time_ns", lambda: nanoseconds)
        seconds, rest = divmod(nanoseconds, 1_000_000_000)
        instant = datetime.datetime.fromtimestamp(seconds, datetime.UTC).replace(microsecond=rest // 1000)
        assert proxy.logging._UtcClock().now() == instant.isoformat().replace("+00:00", "Z")

    def test_a_second_later_it_writes_the_new_second(self, monkeypatch):
        clock = proxy.logging._UtcClock()
        monkeypatch.setattr(time, "time_ns", lambda: 1_795_000_000_500_000_000)
        first = clock.now()
        monkeypatch.setattr(time, "time_ns", lambda: 1_795_000_001_500_000_000)
        assert (first[:19], clock.now()[:19]) == ("2026-11-18T11:06:40", "2026-11-18T11:06:41")
