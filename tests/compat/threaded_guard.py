"""The guard and an upstream served on loopback from one background thread, for clients that run
in this process synchronously or in subprocesses (the compat suite's recording upstream, the agent
CLIs' scripted model)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from aiohttp import web

from proxy.config.settings import settings_from_dict
from proxy.server.backends.models import Models
from proxy.server.process.app import create_app


def generic_upstream(read_timeout: float) -> Callable[[str], dict[str, Any]]:
    """The settings of a generic upstream serving under `/v1` of the root URL it is given."""
    return lambda root: {"base_url": f"{root}/v1", "kind": "generic", "read_timeout": read_timeout}


@contextmanager
def guard_in_thread(
    upstream: web.Application,
    window: int,
    models: Sequence[str],
    read_timeout: float = 60,
    upstream_settings: Callable[[str], dict[str, Any]] | None = None,
) -> Iterator[str]:
    """The guard's root URL, in front of `upstream` (by default a generic upstream; else the
    settings `upstream_settings` gives for its root URL), with `models` (names or globs) given a
    `window`-token window; both stop when the block ends. The guard logs JSON lines wherever the
    suite's logging was configured to write."""
    settings_of = upstream_settings or generic_upstream(read_timeout)
    loop = asyncio.new_event_loop()
    ready, urls = threading.Event(), []
    stop: asyncio.Event | None = None

    async def serve() -> None:
        nonlocal stop
        stop = asyncio.Event()
        up = web.AppRunner(upstream, access_log=None)
        await up.setup()
        await web.TCPSite(up, "127.0.0.1", 0).start()
        root = f"http://127.0.0.1:{up.addresses[0][1]}"
        data = {
            "upstreams": {"up": settings_of(root)},
            "models": {"overrides": [{"match": m, "context_window": window} for m in models]},
            "log": {"format": "json", "level": "info"},
        }
        settings = settings_from_dict(data, "compat.yaml", {})
        guard = web.AppRunner(create_app(settings, Models(settings)), access_log=None, handler_cancellation=True)
        await guard.setup()
        await web.TCPSite(guard, "127.0.0.1", 0).start()
        urls.append(f"http://127.0.0.1:{guard.addresses[0][1]}")
        ready.set()
        await stop.wait()
        await guard.cleanup()
        await up.cleanup()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(120), "the servers did not start"
    try:
        yield urls[0]
    finally:
        assert stop is not None
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
