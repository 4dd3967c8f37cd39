"""Fixtures for the gateway: a real fake upstream, a real proxy in front of it, captured logs.

Both are aiohttp servers on port 0 of 127.0.0.1, in the test's event loop. Clients are the
official `openai` SDK (async, or sync in a worker thread) and plain aiohttp.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

from proxy.config.settings import Settings, settings_from_dict
from proxy.logging import configure_logging
from proxy.server.backends.models import Models
from proxy.server.process.app import create_app
from tests.support.bedrock_upstream import GUARD_AWS_ENV
from tests.support.upstream import FakeUpstream


@pytest.fixture
def guard_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard's AWS credentials for a Bedrock upstream, from its environment (botocore's chain
    reads them first), with no profile or API key of the machine's own in the way."""
    for name, value in GUARD_AWS_ENV.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_BEARER_TOKEN_BEDROCK"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def upstream(aiohttp_server: Any) -> FakeUpstream:
    return await FakeUpstream().served(aiohttp_server)


class _Written(io.StringIO):
    """The log's text, waking whoever waits for a line (written on the loop or in a thread)."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting: set[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = set()

    def write(self, text: str) -> int:
        written = super().write(text)
        for loop, event in list(self.waiting):
            loop.call_soon_threadsafe(event.set)
        return written


class Logs:
    def __init__(self) -> None:
        self.stream = _Written()
        configure_logging("json", "debug", stream=self.stream)

    @property
    def text(self) -> str:
        return self.stream.getvalue()

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        events = [json.loads(line) for line in self.text.splitlines() if line.strip()]
        return [e for e in events if name is None or e.get("event") == name]

    async def written(self, name: str, count: int = 1) -> list[dict[str, Any]]:
        """The `name` events, once at least `count` of them are written (no polling: each write wakes it)."""
        waiter = (asyncio.get_running_loop(), asyncio.Event())
        self.stream.waiting.add(waiter)
        try:
            while len(found := self.events(name)) < count:
                await waiter[1].wait()
                waiter[1].clear()
            return found
        finally:
            self.stream.waiting.discard(waiter)


@pytest.fixture
def logs() -> Logs:
    return Logs()


def gateway_settings(upstream_url: str, env: dict[str, str] | None = None, **sections: Any) -> Settings:
    """Settings as a YAML file would give them: one upstream `fake` unless `upstreams` is given."""
    fake = {"base_url": upstream_url, "kind": "generic", "read_timeout": 5, "connect_timeout": 2}
    data: dict[str, Any] = {"upstreams": {"fake": fake}}
    data.update(sections)
    return settings_from_dict(data, "test.yaml", env or {})


Proxy = Callable[..., Awaitable[TestServer]]


@pytest.fixture
def start_proxy(aiohttp_server: Any, model_map: Any, logs: Logs) -> Proxy:
    async def start(settings: Settings) -> TestServer:
        app = create_app(settings, Models(settings, model_map))
        return await aiohttp_server(app)  # type: ignore[no-any-return]

    return start


@pytest.fixture
async def proxy(start_proxy: Proxy, upstream: FakeUpstream) -> TestServer:
    return await start_proxy(gateway_settings(upstream.url))  # type: ignore[attr-defined]


def long_conversation(turns: int = 80, words: int = 60) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "You are a patient tutor."}]
    for i in range(turns):
        messages.append(
            {"role": "user", "content": f"Question {i}: " + "explain the water cycle in detail " * (words // 6)}
        )
        messages.append(
            {"role": "assistant", "content": f"Answer {i}: " + "water evaporates condenses and falls " * (words // 6)}
        )
    messages.append({"role": "user", "content": "Thanks! One last question: why is the sky blue?"})
    return messages
