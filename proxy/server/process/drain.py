"""The drain state of a serving process: the requests in flight, and `Connection: close` on every
answer once it is stopping, so clients and load balancers take their next request elsewhere
(`proxy.server.process.lifecycle` drives the steps; the app's middleware counts the requests)."""

from __future__ import annotations

import asyncio

from aiohttp import web


class Drain:
    """Requests in flight, and what happened to them while the process was stopping."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.draining = False
        self.served_while_draining = 0
        self._idle = asyncio.Event()
        self._idle.set()

    def started(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def finished(self) -> None:
        self.in_flight -= 1
        if self.draining:
            self.served_while_draining += 1
        if self.in_flight == 0:
            self._idle.set()

    async def wait_idle(self, timeout: float) -> bool:
        """True when nothing is in flight any more; False if `timeout` ran out first."""
        if self._idle.is_set():
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True


DRAIN = web.AppKey("drain", Drain)


async def _close_when_draining(request: web.Request, response: web.StreamResponse) -> None:
    # Before the headers go out, so clients and load balancers read `Connection: close` and open
    # their next connection elsewhere instead of reusing this one.
    # aiohttp has already chosen its headers when this hook runs, hence the header set here too.
    if request.app[DRAIN].draining:
        response.force_close()
        response.headers["Connection"] = "close"


def install_drain(app: web.Application) -> None:
    """The drain state. The app's middleware calls `Drain.started()` before anything else a
    request does and `Drain.finished()` after everything (its log line included)."""
    app[DRAIN] = Drain()
    app.on_response_prepare.append(_close_when_draining)
