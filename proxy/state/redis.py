"""Learned state shared through Redis, that never holds a request up.

Every read first looks at a local copy that is reused for `local_cache_seconds` (a miss is
remembered too, so a model with nothing learned costs one Redis round trip per interval, not one
per request). A call that Redis does not answer within `deadline_ms` (or that fails) is answered
from the local copy instead, counted as a fallback, and Redis is then left alone for
`retry_seconds`, so while it is down requests pay nothing at all. The first failure and the
recovery are each logged once. Writes go to the local copy first, then to Redis under the same
deadline, so a correction learned while Redis was away still applies on this replica.

`open()` connects before the process serves: a fresh connection costs a handshake and first-use
work that can take longer than the deadline on a busy machine, and paid by a restarted replica's
first request it would cost that request the correction the other replicas taught it.

Uses redis-py's asyncio client; values are JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from proxy.state.store import MemoryStore, StateKey, StateOptions, StateStatus, Value

OPEN_SECONDS = 2.0  # the longest `open()` waits for Redis at start (a deadline's worth at the least)


@dataclass(frozen=True, slots=True)
class _Local:
    value: Value | None  # None: Redis had nothing under this key
    fresh_until: float  # reused without asking Redis until then


class RedisStore:
    def __init__(
        self,
        options: StateOptions,
        log: Any | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if options.url is None:
            raise ValueError("RedisStore needs state.url")
        self.options = options
        self._log = log
        self._clock = clock
        self._deadline = options.deadline_ms / 1000
        self._local = MemoryStore(options.max_local_entries, clock)
        # One immediate retry replaces a connection that died with a restarted server; the deadline
        # bounds everything, so no backoff can hold a request.
        self._client: aioredis.Redis = aioredis.Redis.from_url(
            options.url,
            socket_connect_timeout=max(self._deadline, 0.05),
            socket_timeout=max(self._deadline * 4, 0.5),
            retry=Retry(NoBackoff(), 1),
            health_check_interval=0,
        )
        self._down_until = 0.0
        self._shared = True
        self.fallbacks = 0
        self.errors = 0
        self.redis_reads = 0
        self.redis_writes = 0
        self.local_hits = 0
        self.last_error: str | None = None

    async def get(self, key: StateKey) -> Value | None:
        now = self._clock()
        local = self._local.peek(key)
        if local is not None and local.fresh_until > now:
            self.local_hits += 1
            return local.value
        if now < self._down_until:
            self.fallbacks += 1
            return local.value if local is not None else None
        name = key.render(self.options.namespace)
        try:
            raw, ttl_ms = await self._call(self._read(name))
        except _Unavailable:
            self.fallbacks += 1
            return local.value if local is not None else None
        self.redis_reads += 1
        value = self._decode(raw)
        # The local copy lives as long as Redis keeps the key (a miss: one cache interval).
        ttl = ttl_ms / 1000 if value is not None and ttl_ms > 0 else self.options.local_cache_seconds
        self._local.store(key, _Local(value, now + self.options.local_cache_seconds), max(ttl, 0.001))
        return value

    async def put(self, key: StateKey, value: Value, ttl_seconds: float) -> None:
        now = self._clock()
        self._local.store(key, _Local(value, now + self.options.local_cache_seconds), ttl_seconds)
        if now < self._down_until:
            self.fallbacks += 1
            return
        name = key.render(self.options.namespace)
        try:
            await self._call(self._client.set(name, orjson.dumps(value), px=max(1, int(ttl_seconds * 1000))))
        except _Unavailable:
            self.fallbacks += 1
            return
        self.redis_writes += 1

    def status(self) -> StateStatus:
        return StateStatus(
            backend="redis",
            shared=self._shared,
            fallbacks=self.fallbacks,
            errors=self.errors,
            last_error=self.last_error,
        )

    async def open(self) -> None:
        """Connect (one pooled connection) before the first request; Redis down is a logged fallback."""
        with contextlib.suppress(_Unavailable):
            await self._call(self._client.ping(), max(self._deadline, OPEN_SECONDS))

    async def close(self) -> None:
        await self._client.aclose()

    async def _read(self, name: str) -> tuple[bytes | None, int]:
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.get(name)
            pipe.pttl(name)
            raw, ttl_ms = await pipe.execute()
        return raw, int(ttl_ms)

    async def _call(self, call: Any, deadline: float | None = None) -> Any:
        try:
            result = await asyncio.wait_for(call, deadline or self._deadline)
        except (TimeoutError, RedisError, OSError) as exc:
            self._failed(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
            raise _Unavailable from None
        if not self._shared:
            self._shared = True
            if self._log is not None:
                self._log.info("state_store_recovered", backend="redis", fallbacks=self.fallbacks)
        return result

    def _failed(self, reason: str) -> None:
        self.errors += 1
        self.last_error = reason[:200]
        self._down_until = self._clock() + self.options.retry_seconds
        if self._shared:
            self._shared = False
            if self._log is not None:
                self._log.warning(
                    "state_store_unavailable",
                    backend="redis",
                    error=self.last_error,
                    fallback="local state",
                    retry_seconds=self.options.retry_seconds,
                )

    def _decode(self, raw: bytes | None) -> Value | None:
        if raw is None:
            return None
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            self.errors += 1
            self.last_error = "a stored value is not JSON"
            return None


class _Unavailable(Exception):
    """Redis did not answer in time or failed; the caller uses local state."""
