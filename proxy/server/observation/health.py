"""Health that means something: `/livez`, `/readyz`, and `/healthz` (liveness with the version).

- `/livez`: the process serves HTTP. Nothing else; a liveness probe that fails restarts the pod.
- `/readyz`: this process should get new requests: its config is loaded, its tokenizers are
  ready, every upstream answered recently, and it is not draining. Otherwise 503 with every
  reason, so a load balancer takes it out of rotation and a person can read why.

An upstream counts as reachable when a TCP connection to it succeeded, or a call through the
upstream pool had an answer (`UpstreamPool.answered`, which the upstream call writes without
asking this module), within `reachable_within_seconds`. A
background task connects to each upstream every `probe_interval_seconds`, skipping upstreams
seen recently, so an idle replica still knows whether its upstreams are there.

These paths bypass the client keys: probes carry no credentials (`proxy.server.edge.local_paths`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from aiohttp import web

from proxy import package_version
from proxy.config.settings import ReadinessSettings

# `readiness.*` settings: written once, in the settings schema.
ReadinessOptions = ReadinessSettings



@dataclass
class _Seen:
    at: float | None = None  # monotonic time of the last success
    error: str | None = None  # why the last probe failed


class Reachability:
    """When each upstream was last reached, from probes and from real traffic."""

    def __init__(
        self,
        upstreams: Mapping[str, str],
        options: ReadinessOptions,
        clock: Callable[[], float] = time.monotonic,
        answered: Mapping[str, float] | None = None,
    ) -> None:
        self.options = options
        self._clock = clock
        self._answered = answered if answered is not None else {}  # by real traffic, on `clock`'s scale
        self._addresses = {name: _address(url) for name, url in upstreams.items()}
        self._seen = {name: _Seen() for name in upstreams}

    def replace_upstreams(self, upstreams: Mapping[str, str]) -> None:
        """After a config reload: keep what is known of upstreams that remain."""
        self._addresses = {name: _address(url) for name, url in upstreams.items()}
        self._seen = {name: self._seen.get(name, _Seen()) for name in upstreams}

    def saw(self, name: str) -> None:
        """Record a response from `name` (any status: it answered)."""
        if name in self._seen:
            self._seen[name] = _Seen(self._clock())

    def _last(self, name: str, seen: _Seen) -> float | None:
        """When `name` was last reached, by a probe or by real traffic."""
        answered = self._answered.get(name)
        if answered is None or (seen.at is not None and seen.at >= answered):
            return seen.at
        return answered

    def problems(self) -> list[str]:
        now, within = self._clock(), self.options.reachable_within_seconds
        out = []
        for name, seen in self._seen.items():
            at = self._last(name, seen)
            if at is None or now - at > within:
                # A probe's error is the latest word only when no answer came after the probe's success.
                error = seen.error if at == seen.at else None
                why = f": {error}" if error else (": not checked yet" if at is None else "")
                out.append(f"upstream {name!r} not reached in the last {within:g} s{why}")
        return out

    async def probe_all(self) -> None:
        """Connect to every upstream not seen within one probe interval."""
        now = self._clock()
        due = [
            name
            for name, seen in self._seen.items()
            if (at := self._last(name, seen)) is None or now - at >= self.options.probe_interval_seconds
        ]
        await asyncio.gather(*(self._probe(name) for name in due))

    async def run(self) -> None:
        while True:
            await self.probe_all()
            await asyncio.sleep(self.options.probe_interval_seconds)

    async def _probe(self, name: str) -> None:
        host, port = self._addresses[name]
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), self.options.probe_timeout_seconds)
        except (OSError, TimeoutError) as exc:
            if name in self._seen:
                previous = self._seen[name]
                reason = os_error_reason(exc)
                self._seen[name] = _Seen(previous.at, f"{host}:{port} {reason}")
            return
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        self.saw(name)


def os_error_reason(exc: OSError | TimeoutError) -> str:
    """`Connection refused`, not asyncio's `Connect call failed ('127.0.0.1', 1)`."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    return os.strerror(exc.errno) if exc.errno else exc.strerror or type(exc).__name__


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "localhost", parts.port or (443 if parts.scheme == "https" else 80)


@dataclass
class Health:
    """What `/readyz` reads: set by the process lifecycle, read by every probe."""

    reachability: Reachability
    config_source: str
    tokenizers_ready: bool = True  # `serve` sets it False until the configured vocabularies are loaded
    draining: bool = False
    version: str = field(default_factory=package_version)

    def problems(self) -> list[str]:
        out = []
        if self.draining:
            out.append("draining: shutting down")
        if not self.tokenizers_ready:
            out.append("tokenizers are still loading")
        if self.reachability.options.require_upstreams:
            out.extend(self.reachability.problems())
        return out


HEALTH = web.AppKey("health", Health)


async def livez(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def healthz(request: web.Request) -> web.Response:
    """Liveness, kept for existing probes, with the version."""
    return web.json_response({"status": "ok", "version": request.app[HEALTH].version})


async def readyz(request: web.Request) -> web.Response:
    health = request.app[HEALTH]
    problems = health.problems()
    body: dict[str, object] = {"status": "ready" if not problems else "not ready", "config": health.config_source}
    if problems:
        body["reasons"] = problems
    return web.json_response(body, status=503 if problems else 200)


def install_health(app: web.Application, health: Health) -> None:
    """The shared state and the upstream probe for the app's lifetime; the app's dispatch serves
    `livez`, `readyz` and `healthz` on their canonical paths."""
    app[HEALTH] = health
    app.cleanup_ctx.append(_probing)


async def _probing(app: web.Application) -> AsyncIterator[None]:
    # The first round starts at once, so the process is ready as soon as its upstreams answer.
    task = asyncio.create_task(app[HEALTH].reachability.run())
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
