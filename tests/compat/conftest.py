"""The client-compatibility suite's servers: the guard in front of a recording upstream, both served
from one background thread (so that every library, sync or async, or a CLI in a subprocess, can
call them), each test starting with a fresh recording."""

from __future__ import annotations

import io
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from proxy.logging import configure_logging
from tests.compat.recording_upstream import RecordingUpstream
from tests.compat.threaded_guard import guard_in_thread

WINDOW = 4096  # the window the suite's models are given: a long conversation cannot fit
CHAT_MODEL = "gpt-4o-mini"
CLAUDE_MODEL = "claude-sonnet-4-6"
GEMINI_MODEL = "gemini-2.5-flash"

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/compat/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.compat)


@dataclass
class Servers:
    upstream: RecordingUpstream
    root: str  # the guard's root URL (http://127.0.0.1:PORT)
    logs: io.StringIO
    seen: int = 0  # log lines written before the current test

    def reset(self) -> None:
        self.upstream.reset()
        self.seen = len(self.log_events())

    @property
    def v1(self) -> str:
        return f"{self.root}/v1"

    def log_events(self) -> list[dict[str, Any]]:
        lines = self.logs.getvalue().splitlines()
        return [e for e in map(json.loads, filter(None, lines)) if e.get("event") == "request"]

    def last_log(self, requests: int = 1) -> dict[str, Any]:
        """The log line of the test's last request, once its `requests` requests are all logged (a
        line is written just after the answer's last byte, so it may be a moment behind the client)."""
        for _ in range(500):
            events = self.log_events()[self.seen :]
            if len(events) >= requests:
                return events[-1]
            threading.Event().wait(0.02)
        raise AssertionError("the request was not logged")


@pytest.fixture(scope="session")
def servers() -> Iterator[Servers]:
    logs = io.StringIO()
    configure_logging("json", "info", stream=logs)
    upstream = RecordingUpstream()
    with guard_in_thread(upstream.app(), WINDOW, (CHAT_MODEL, CLAUDE_MODEL, GEMINI_MODEL), read_timeout=20) as url:
        yield Servers(upstream, url, logs)


@pytest.fixture
def guard(servers: Servers) -> Servers:
    servers.reset()
    return servers
