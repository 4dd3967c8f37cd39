"""The bytes of request bodies one serving process holds at once: a budget, and each client's share of it.

A body's bytes are taken from the budget as they come (the announced `Content-Length` before any
is read, a chunked body chunk by chunk) and as they are inflated (chunk by chunk, in the thread
that inflates), and given back, all at once, when the request ends, however it ends: answered,
refused, or its client gone (aiohttp cancels the handler when the connection closes:
`handler_cancellation`). The compressed bytes stay counted beside the inflated ones: the request
keeps both until it ends.

- **A share per client.** One client (its credential, else its address:
  `proxy.server.threads.placement.client_key`) holds at most `per_client` bytes; past it, its next
  body is refused with 429 and `Retry-After`, while others are still served.
- **A budget for the process.** Past `total` bytes, any body is refused with 503 `overloaded` and
  `Retry-After`: the guard says it is busy instead of growing until the kernel kills it.

What a held body costs beyond its bytes (its parse, its count) grows with it: the memory this
bounds is written down, and measured, in docs/security.md ("The memory bound"). Counted under a
lock: the inflating thread takes from the budget while the event loop gives back.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

from aiohttp import web

from proxy.errors import Overloaded, TooManyRequests

MIB = 1024 * 1024


@dataclass(frozen=True)
class BodyLimits:
    """`total`: bytes of request bodies held at once by the process (compressed and inflated
    counted); `per_client`: what one client may hold of it; `retry_after`: seconds a refused
    client is told to wait (the time a body of the limit takes to be counted and answered)."""

    total: int
    per_client: int
    retry_after: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.per_client <= self.total:
            raise ValueError(f"a client's share ({self.per_client:,}) must be positive and within the total")


class BodyBudget:
    """The bytes held now, in all and per client; `hold(client)` opens one request's account."""

    def __init__(self, limits: BodyLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._held = 0
        self._by_client: dict[str, int] = {}
        self.refused = 0  # bodies refused since start (for tests and the curious)

    @property
    def held(self) -> int:
        return self._held

    def held_by(self, client: str) -> int:
        return self._by_client.get(client, 0)

    def hold(self, client: str) -> HeldBody:
        return HeldBody(self, client)

    def _take(self, client: str, size: int) -> None:
        limits = self.limits
        with self._lock:
            mine = self._by_client.get(client, 0)
            if mine + size > limits.per_client:
                self.refused += 1
                raise TooManyRequests(
                    f"this client's request bodies would hold {_mib(mine + size)} in context-guard, over its "
                    f"share of {_mib(limits.per_client)}; retry once its other requests are answered",
                    headers=self._retry(),
                )
            if self._held + size > limits.total:
                self.refused += 1
                raise Overloaded(
                    f"context-guard holds {_mib(self._held)} of request bodies, its limit is {_mib(limits.total)}; "
                    "retry shortly",
                    headers=self._retry(),
                )
            self._held += size
            self._by_client[client] = mine + size

    def _give_back(self, client: str, size: int) -> None:
        with self._lock:
            self._held -= size
            left = self._by_client.get(client, 0) - size
            if left > 0:
                self._by_client[client] = left
            else:
                self._by_client.pop(client, None)

    def _retry(self) -> dict[str, str]:
        return {"Retry-After": str(max(1, math.ceil(self.limits.retry_after)))}


class HeldBody:
    """One request's bytes on the budget: `take(n)` as they come (or raise 429 / 503), `release()`
    when the request ends (again is harmless)."""

    __slots__ = ("_budget", "client", "size")

    def __init__(self, budget: BodyBudget, client: str) -> None:
        self._budget, self.client, self.size = budget, client, 0

    def take(self, size: int) -> None:
        if size > 0:
            self._budget._take(self.client, size)
            self.size += size

    def release(self) -> None:
        size, self.size = self.size, 0
        if size:
            self._budget._give_back(self.client, size)


def _mib(size: int) -> str:
    return f"{size / MIB:,.1f} MiB"


BODY_BUDGET = web.AppKey("body_budget", BodyBudget)
HELD_BODY = web.RequestKey("held_body", HeldBody)  # the request's account, released by the middleware when it ends
