"""The upstream connections: a bounded pool, shared fairly per client.

Calls upstream take a slot of a bounded pool (`PoolPolicy`); a request that waits longer than
`server.connection_wait_seconds` for one gets 503 `overloaded` with `Retry-After`, which says "the
proxy is busy", not 504 "the upstream is slow"."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

from aiohttp import web

from proxy.errors import Overloaded


@dataclass(frozen=True)
class PoolPolicy:
    """`size`: upstream calls in flight at once (streams hold theirs until they end);
    `wait`: seconds a request may wait for a free one before it gets 503."""

    size: int = 1024
    wait: float = 5.0

    def __post_init__(self) -> None:
        if not isinstance(self.size, int) or isinstance(self.size, bool) or self.size < 1:
            raise ValueError(f"server.upstream_connections must be a whole number of at least 1, not {self.size!r}")
        if not isinstance(self.wait, int | float) or self.wait < 0:
            raise ValueError(f"server.connection_wait_seconds must be 0 or more, not {self.wait!r}")


@dataclass
class _Share:
    """One client's part of the pool: its own slots, and how many of its calls hold or wait for one."""

    slots: asyncio.Semaphore
    users: int = 0


class UpstreamPool:
    """The slots of `PoolPolicy`: one per upstream call in flight, at most `per_client` of them
    held by one client (`proxy.server.threads.placement.client_key`: its credential, else its address), so
    that one client holding slow streams cannot take them all: a quarter stays for the others."""

    def __init__(self, policy: PoolPolicy) -> None:
        self.policy = policy
        self.per_client = max(1, policy.size - policy.size // 4)
        self._slots = asyncio.Semaphore(policy.size)
        self._shares: dict[str, _Share] = {}  # clients with a call holding or waiting for a slot

    async def acquire(self, client: str = "") -> None:
        """Take a slot for `client`: at once when one is free and the client is within its share,
        else within the deadline (503 `overloaded` after it). Every slot taken is given back with
        `release(client)`."""
        share = self._shares.get(client)
        if share is None:
            share = self._shares[client] = _Share(asyncio.Semaphore(self.per_client))
        share.users += 1
        try:
            if not share.slots.locked() and not self._slots.locked():  # at once: no deadline timer
                await share.slots.acquire()
                await self._slots.acquire()
                return
            async with asyncio.timeout(self.policy.wait):
                await share.slots.acquire()
                try:
                    await self._slots.acquire()
                except BaseException:
                    share.slots.release()
                    raise
        except BaseException as exc:
            self._left(client, share)
            if isinstance(exc, TimeoutError):
                limit = f"{self.policy.size} upstream calls in flight ({self.per_client} for one client)"
                raise Overloaded(
                    f"context-guard is at its limit of {limit}; retry shortly",
                    headers={"Retry-After": str(max(1, math.ceil(self.policy.wait)))},
                ) from None
            raise

    def release(self, client: str = "") -> None:
        self._slots.release()
        share = self._shares[client]
        share.slots.release()
        self._left(client, share)

    def _left(self, client: str, share: _Share) -> None:
        share.users -= 1
        if share.users == 0:
            del self._shares[client]


UPSTREAM_POOL = web.AppKey("upstream_pool", UpstreamPool)
